"""Decompositions for an EP (`convert --rewrite-for EP`): small, verified rewrites of an op the EP
does not take into ops its own table says it does (HardSwish as x * HardSigmoid(x), LayerNormalization
as reductions, ...). One module per family, one registry (registry.py), applied and accounted for in
apply.py; the real session's placement before and after in placement.py."""
