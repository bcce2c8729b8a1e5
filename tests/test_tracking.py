"""The embedded store: a new mlflow.db is seeded from a migrated empty copy and reads as MLflow's own."""

import sqlite3

from mlflow.tracking import MlflowClient

from dinox.store.backend import prepare_store


def _schema(db):
    """Tables, indexes and the migration head (the SQL text differs with how alembic rebuilt a table)."""
    with sqlite3.connect(db) as c:
        names = c.execute("SELECT type, name FROM sqlite_master ORDER BY name").fetchall()
        version = c.execute("SELECT version_num FROM alembic_version").fetchall()
    return names, version


def test_a_new_store_is_a_copy_of_a_migrated_empty_one_with_its_own_default_experiment(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    reference = tmp_path / "reference.db"
    expected = MlflowClient(f"sqlite:///{reference}").get_experiment("0")  # MLflow's own, for comparison
    for name in ("a.db", "b.db"):  # the first makes the cached template, the second copies it
        prepare_store(f"sqlite:///{tmp_path / name}")
        assert _schema(tmp_path / name) == _schema(reference)
        default = MlflowClient(f"sqlite:///{tmp_path / name}").get_experiment("0")
        assert (default.name, default.artifact_location) == (expected.name, expected.artifact_location)
        assert default.artifact_location.endswith(f"{tmp_path.name}/mlruns/0")
    assert list((tmp_path / "cache" / "dinox").glob("mlflow-*-empty.db"))
    client = MlflowClient(f"sqlite:///{tmp_path / 'b.db'}")
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "images_per_s", 1.0)
    assert client.get_run(run.info.run_id).data.metrics == {"images_per_s": 1.0}


def test_an_existing_store_is_left_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = tmp_path / "m.db"
    client = MlflowClient(f"sqlite:///{db}")
    eid = client.create_experiment("kept")
    prepare_store(f"sqlite:///{db}")
    assert client.get_experiment(eid).name == "kept"
    assert not (tmp_path / "cache" / "dinox").exists()
