"""The cached list of timm architectures: the same answers as timm, without importing timm once cached."""

from __future__ import annotations

import os
import subprocess
import sys

import timm

from dinox.measure.models import unknown_model
from dinox.plan import model_names


def test_the_cache_is_timms_registry_and_spares_the_import(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert model_names.architectures() == timm.list_models()  # written on first use
    (cache,) = (tmp_path / "dinox").glob("timm-*-models.txt")
    assert cache.read_text().split() == timm.list_models()
    code = (
        "import sys\nfrom dinox.plan.model_names import unknown_model\n"
        "print(unknown_model('vit_tiny_patch16_224.augreg_in21k'), unknown_model('resnet5O'), "
        "'timm' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)),
    ).stdout
    assert out.strip() == f"None {unknown_model('resnet5O')} False False"
    assert "did you mean 'resnet50'" in out
