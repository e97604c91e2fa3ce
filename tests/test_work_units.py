"""The suite's work units (tests/conftest.py) as pytest-xdist's loadgroup scheduler reads them: a
unit whose name xdist cannot read back runs each of its tests as a unit of its own, on any
worker, and starts its module fixtures (a vLLM engine, SmolLM2) once per test instead of once."""

from __future__ import annotations

from conftest import work_unit
from xdist.scheduler.loadgroup import LoadGroupScheduling


def test_every_work_unit_is_read_back_whole_by_xdist(request):
    scheduler = LoadGroupScheduling.__new__(LoadGroupScheduling)  # _split_scope reads no state
    items = request.session.items
    units = {item.nodeid: work_unit(item) for item in items}
    misread = {nodeid: unit for nodeid, unit in units.items() if scheduler._split_scope(f"{nodeid}@{unit}") != unit}
    assert not misread, misread
    # The split file is split by its module fixtures, not by test.
    vllm_units = {unit for nodeid, unit in units.items() if nodeid.startswith("tests/test_vllm_backend.py")}
    vllm_tests = sum(nodeid.startswith("tests/test_vllm_backend.py") for nodeid in units)
    assert vllm_tests < 2 or len(vllm_units) < vllm_tests, vllm_units
