"""The benchmarks' own tests (benchmarks/test_*.py): the fixtures they share with tests/.

The tests here check the benchmarks' tools (their upstreams, relay, bodies, report and
measures) or run a benchmark briefly with its own checks; CI runs them with the suite
(`testpaths` in pyproject.toml). pytest finds fixtures only in a test's own directory and
above, so the real-process starters of tests/conftest.py are taken from there; every test here
names its layer (unit, property, e2e) itself.
"""

from tests.conftest import (  # noqa: F401  (fixtures, see there)
    start_module_process,
    start_process_fixture,
    start_process_session,
)
