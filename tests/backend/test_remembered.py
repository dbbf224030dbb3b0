"""RememberedTable: JSON tables in Frost's cache directory (cuDNN plans, weight-gradient kernel choices)."""
import json

from frost.backend.remembered import RememberedTable, cache_root
from frost.kernel.compile import cache_dir


def test_table_round_trips_through_the_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path and cache_dir() == tmp_path / "kernels"
    table = RememberedTable("choices.json")
    assert table.load() == {}
    table.load()["key"] = {"ours": True}
    table.save()
    assert json.loads((tmp_path / "choices.json").read_text()) == {"key": {"ours": True}}
    assert not list(tmp_path.glob("*.tmp*"))  # written through a temporary file, then renamed
    (tmp_path / "choices.json").write_text(json.dumps({"other": 1}))
    assert table.load() == {"key": {"ours": True}}  # kept in memory
    table.forget()
    assert table.load() == {"other": 1}


def test_a_broken_or_unwritable_table_only_costs_the_timing_again(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    (tmp_path / "plans.json").write_text("{not json")
    table = RememberedTable("plans.json")
    assert table.load() == {}
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("FROST_CACHE_DIR", str(blocker))  # a cache "directory" that is a file
    unwritable = RememberedTable("plans.json")
    unwritable.load()["k"] = 1
    unwritable.save()  # no error
    assert unwritable.load() == {"k": 1}
