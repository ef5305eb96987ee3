"""Arena's benchmarks: one script per figure, each printing ONE JSON object on stdout.

Run them from the repository root as docs/benchmarks.md shows (``python bench/X.py [--quick]``) or as
modules (``python -m bench.X``). A script run by path puts the repository root first on
``sys.path`` and takes its own folder off it before importing anything of Arena's, so
``bench/trainer.py`` does not shadow the ``trainer`` package; scripts import their siblings as
``from bench import sft_stages``. ``--quick`` is every bench's smoke run (seconds to a few
minutes; ``tests/test_bench_quick.py`` runs them in CI): same code paths and JSON keys, with
``"quick": true``, and its figures are not measurements.
"""
