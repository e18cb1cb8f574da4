"""Benchmarks: ``rlspeed-bench NAME [--quick] [--out DIR]``, each writing CSV, markdown
and a PNG plot stamped with the machine, library versions and configs."""
