"""capdisc's worker processes: the Celery indexing worker and the discovery worker.

A worker answers one request at a time per thread, and several worker processes share the
machine's cores, so a BLAS thread pool inside each only spins against the others: measured with
two discovery workers on two cores, 11.6 ms of CPU a turn with OpenBLAS's default threads against
2.2 ms with one (``benchmarks/discovery_speed.py``). Worker processes therefore use one BLAS
thread unless the environment already says otherwise; this runs before numpy is imported.
"""

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
