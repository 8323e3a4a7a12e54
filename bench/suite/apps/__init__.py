"""ortprep's outputs swapped into real applications (issue 21): see README.md here."""
