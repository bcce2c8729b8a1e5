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


def test_a_damaged_store_or_template_is_one_line_not_a_traceback(tmp_path):
    """A damaged mlflow.db once gave run and decide a SQLAlchemy traceback; a damaged cached template was
    copied into every new store. Now: the store is named in one line, exit 2, left as it was; the template
    is made again."""
    import mlflow

    from tests.conftest import TINY, run_dinox

    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    (tmp_path / "s.yaml").write_text(TINY.format(name="damaged"))
    damaged = b"SQLite format 3\x00" + bytes(range(256)) * 8
    (tmp_path / "mlflow.db").write_bytes(damaged)
    decide = ["decide", "--experiment", "damaged", "--days", "1", "--target-images", "100"]
    for args in (["run", "s.yaml"], decide):
        proc = run_dinox(args, tmp_path, env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.strip() == (
            f"error: tracking store sqlite:///{tmp_path / 'mlflow.db'}: {tmp_path / 'mlflow.db'} is not a readable "
            "SQLite database (file is not a database); move it aside to start a new one"
        ), proc.stderr
    assert (tmp_path / "mlflow.db").read_bytes() == damaged and not (tmp_path / ".dinox").exists()

    template = tmp_path / "cache" / "dinox" / f"mlflow-{mlflow.__version__}-empty.db"
    template.parent.mkdir(parents=True, exist_ok=True)  # the model names' cache may be there
    template.write_bytes(damaged)
    (tmp_path / "mlflow.db").unlink()
    proc = run_dinox(["run", "s.yaml"], tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _schema(template)[1]  # made again: migrated, with its alembic version
    assert MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_experiment_by_name("damaged")


def test_a_database_store_that_is_down_is_one_line_at_once(tmp_path):
    """PostgreSQL down at start once cost 104 s of MLflow's retries and then a traceback."""
    from tests.conftest import TINY, run_dinox

    (tmp_path / "s.yaml").write_text(TINY.format(name="down"))
    uri = "postgresql://team:s3cret@127.0.0.1:9/dinox"
    decide = ["decide", "--experiment", "down", "--days", "1", "--target-images", "100", "--tracking-uri", uri]
    for args in (["run", "s.yaml", "--tracking-uri", uri], decide):
        proc = run_dinox(args, tmp_path, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.strip().endswith(
            "cannot reach the database at postgresql://team:***@127.0.0.1:9/dinox (connection refused)"
        ), proc.stderr
        assert "s3cret" not in proc.stdout + proc.stderr
    assert not (tmp_path / ".dinox").exists()
