"""What `make bench` runs (bench/suite/run_all.py); each script writes its own table."""
