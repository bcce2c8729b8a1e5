"""`--set KEY=VALUE`: overrides from the command line, validated like the file, errors naming the override."""

import pytest

from dinox.plan import grid
from dinox.spec import file as spec_file
from dinox.spec import overrides
from tests.conftest import TINY, run_dinox

# 452 bytes of YAML that name 10^9 values: the --set reader ran past 60 s at 2.8-4.5 GB.
BOMB = (
    "{a: &a [x, x, x, x, x, x, x, x, x, x], "
    + ", ".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    + "}"
)


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(TINY.format(name="o") + "sweep:\n  grid:\n    loader.num_workers: [0, 1]\n")
    return spec_file.load(path)


def test_values_are_yaml_and_land_in_every_trial(doc):
    items = overrides.parse(["batch.size=8", "precision=bf16-mixed;data.sample_delay_ms=2.5", ""])
    trials = grid.expand(overrides.apply(doc, items))
    assert [t.spec.size for t in trials] == [8, 8] and {t.spec.precision for t in trials} == {"bf16-mixed"}
    assert trials[0].spec.data.sample_delay_ms == 2.5
    assert overrides.apply(doc, items).text.endswith(
        "# --set batch.size=8\n# --set precision=bf16-mixed\n# --set data.sample_delay_ms=2.5\n"
    )


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("loader.num_workers=2", "is swept by the spec's sweep section"),
        ("sweep.grid=3", "a sweep is edited in the file"),
        ("batch.size.x=3", "batch.size is 4, not a section"),
        ("batchsize", "needs KEY=VALUE"),
        ("batch.size=[1", "not valid YAML"),
        # A section holding a swept field: its sweep would silently vanish (batch.accumulation fell to 1).
        ("loader={num_workers: 4}", "the sweep varies loader.num_workers: setting loader would replace it"),
        # The file's limits: nesting (3,000 deep was a RecursionError, 100 deep passed) and alias bombs.
        ("model.kwargs=" + "[" * 3000 + "]" * 3000, "nested more than 32 levels deep"),
        ("model.kwargs.a=" + "[" * 31 + "]" * 31, "nested more than 32 levels deep"),  # 2 keys down + 31
        ("model.kwargs=" + BOMB, "expands to more than 100000 values through anchors and aliases"),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else v,
)
def test_bad_overrides_are_named(doc, item, message):
    with pytest.raises(spec_file.SpecError) as e:
        overrides.apply(doc, overrides.parse([item]))
    assert message in e.value.render() and f"(--set {item.split(';')[0]}" in e.value.render()


def test_a_value_the_models_refuse_names_its_override_on_the_command_line(tmp_path):
    (tmp_path / "s.yaml").write_text(TINY.format(name="o"))
    proc = run_dinox(
        ["plan", "s.yaml", "--no-estimate", "--set", "batch.size=-3", "--set", "batch.sizee=3"], cwd=tmp_path
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "batch.size: " in proc.stderr and "(from --set batch.size=-3)" in proc.stderr, proc.stderr
    assert "batch.sizee" in proc.stderr and "(from --set batch.sizee=3)" in proc.stderr
    ok = run_dinox(["plan", "s.yaml", "--no-estimate", "--set", "batch.size=16"], cwd=tmp_path)
    assert ok.returncode == 0 and "16" in ok.stdout, ok.stderr


def test_an_override_has_the_file_s_limits_on_the_command_line(tmp_path, monkeypatch):
    """Through `dinox validate`: an alias bomb in --set is refused at once, and a section holding a swept
    field is refused instead of silently replacing the sweep."""
    from click.testing import CliRunner

    from dinox.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(TINY.format(name="o") + "sweep:\n  grid:\n    batch.size: [2, 4]\n")
    for item, message in (
        (f"model.kwargs={BOMB}", "expands to more than 100000 values"),
        ("batch={size: 4}", "the sweep varies batch.size: setting batch would replace it in every trial"),
    ):
        result = CliRunner().invoke(main, ["validate", "s.yaml", "--set", item])
        assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
