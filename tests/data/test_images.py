"""Image sources on real JPEG and PNG files: image folders, image shards, timm's transforms and Mixup, the
device-side preparation (GPU decoding's logic run on the CPU), and bad files failing the trial by name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from PIL import Image

from dinox.data.device_prep import DevicePrep
from dinox.data.files import DataError, list_image_folder, write_image_shards
from dinox.data.images import ImageSamples, build_transform
from dinox.data.views import ViewPlan
from dinox.data.webdataset_source import Shards
from dinox.isolate import runner
from dinox.plan import grid
from dinox.spec import file as spec_file
from dinox.spec.data_sources import AugmentSpec, ImageFolderData
from dinox.spec.rules import check_trial
from dinox.spec.sections import TrialSpec
from tests.conftest import ROOT

_demo = importlib.util.spec_from_file_location("make_demo_images", ROOT / "scripts" / "make_demo_images.py")
demo = importlib.util.module_from_spec(_demo)
_demo.loader.exec_module(demo)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """Two classes of real JPEGs (the demo script's, small), and a PNG among them."""
    root = tmp_path_factory.mktemp("images")
    demo.write_tree(root, classes=2, per_class=3, size=(80, 60))
    Image.new("RGB", (50, 70), (200, 30, 30)).save(root / "n00000001" / "extra.png")
    return root


def test_an_image_folder_lists_classes_in_sorted_order(tree):
    classes, items = list_image_folder(tree)
    assert classes == ["n00000000", "n00000001"]
    assert len(items) == 7 and {label for _p, label in items} == {0, 1}
    assert all(label == int(Path(p).parent.name[-1]) for p, label in items)


def test_pil_and_torchvision_decode_the_same_samples(tree):
    _classes, items = list_image_folder(tree)
    plan = ViewPlan(full_size=32)
    pil, tv = (ImageSamples(items, plan, decoder, None) for decoder in ("pil", "torchvision"))
    for i in range(len(items)):
        (a, la), (b, lb) = pil[i], tv[i]
        assert a.dtype == b.dtype == torch.uint8 and a.shape == b.shape == (3, 32, 32) and la == lb
        assert (a.float() - b.float()).abs().mean() < 3  # two JPEG decoders, the same image within rounding


def test_each_augment_knob_reaches_timms_transform():
    knobs = AugmentSpec(
        scale=(0.5, 1.0),
        ratio=(0.9, 1.1),
        hflip=0.25,
        vflip=0.75,
        auto_augment="rand-m7-mstd0.5",
        interpolation="bicubic",
    )
    text = repr(build_transform(32, knobs))
    for expected in ("scale=(0.5, 1.0)", "ratio=(0.9, 1.1)", "RandAugment(n=2", "m=7"):
        assert expected in text, text
    assert "interpolation=bicubic" in repr(build_transform(32, AugmentSpec(interpolation="bicubic")))
    assert "RandomHorizontalFlip(p=0.25)" in text and "RandomVerticalFlip(p=0.75)" in text
    assert "ColorJitter" in repr(build_transform(32, AugmentSpec(color_jitter=0.3)))
    assert "Resize" in repr(build_transform(32, None)) and "CenterCrop" in repr(build_transform(32, None))


def _prep(**data) -> DevicePrep:
    spec = ImageFolderData(root="unused", **data)
    return DevicePrep(spec, torch.device("cpu"), 32, 10)


def test_the_device_batch_is_normalised_erased_and_mixed_as_timm_does():
    prep = _prep(augment={"re_prob": 1.0}, mixup={"mixup_alpha": 0.8, "cutmix_alpha": 1.0})
    batch = torch.full((4, 3, 32, 32), 128, dtype=torch.uint8)
    x = prep.images(batch)
    assert x.dtype == torch.float32
    plain = (128 / 255 - 0.485) / 0.229
    assert not torch.allclose(x[:, 0], torch.full_like(x[:, 0], plain))  # random erasing at p=1 changed pixels
    mixed, targets = prep.mixup(x, torch.tensor([0, 1, 2, 3]))
    assert targets.shape == (4, 10) and torch.allclose(targets.sum(1), torch.ones(4))
    assert _prep().images(batch)[0, 0, 0, 0].item() == pytest.approx(plain, rel=1e-5)  # nothing but normalised


def test_device_decoding_turns_encoded_jpegs_into_a_batch(tree):
    """GPU decoding's own steps, with the CPU as the device: bytes in, a cropped, normalised batch out."""
    _classes, items = list_image_folder(tree)
    jpegs = [p for p, _label in items if p.endswith(".JPEG")][:4]
    samples = ImageSamples([(p, 0) for p in jpegs], ViewPlan(full_size=32), "pil", None, encoded=True)
    encoded = [samples[i][0] for i in range(len(jpegs))]
    assert all(e.dtype == torch.uint8 and e.dim() == 1 for e in encoded)  # a worker only read the file
    for augment in (None, {"hflip": 1.0}):
        x = _prep(decode_device="cuda", augment=augment).images(encoded)
        assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_decoding_on_a_gpu(tree):
    _classes, items = list_image_folder(tree)
    jpegs = [p for p, _label in items if p.endswith(".JPEG")]
    encoded = [torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8) for p in jpegs]
    spec = ImageFolderData(root="unused", decode_device="cuda")
    x = DevicePrep(spec, torch.device("cuda"), 32, 10).images(encoded)
    assert x.is_cuda and x.shape == (len(jpegs), 3, 32, 32)


def test_image_shards_read_back_the_same_samples(tree, tmp_path):
    paths = write_image_shards(tree, tmp_path, shard_size=3)
    assert len(paths) == 3  # 7 images, 3 a shard
    _classes, items = list_image_folder(tree)
    plan = ViewPlan(full_size=32)
    folder = ImageSamples(items, plan, "pil", None)
    shards = Shards(str(tmp_path), plan, None, decoder="pil", shuffle_buffer=0, seed=0, num_classes=1000)
    read = list(shards)
    assert len(read) == len(items)
    for i, (image, label) in enumerate(read):
        expected, expected_label = folder[i]
        assert label == expected_label and torch.equal(image, expected)


def test_bad_files_name_themselves(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    bad = tmp_path / "a" / "broken.JPEG"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    notes = tmp_path / "a" / "notes.txt"
    notes.write_text("not an image")
    with pytest.raises(DataError, match=f"{tmp_path / 'b'}: an empty class folder"):
        list_image_folder(tmp_path)
    for decoder in ("pil", "torchvision"):
        samples = ImageSamples([(str(bad), 0), (str(notes), 0)], ViewPlan(full_size=32), decoder, None)
        for i, path in enumerate((bad, notes)):
            with pytest.raises(DataError, match=f"cannot decode {path}"):
                samples[i]


def test_image_pipeline_rules():
    base = {"name": "r", "model": {"name": "resnet18"}, "batch": {"size": 4}}
    image = {"source": "image_folder", "root": "x"}

    def paths(**changes) -> list[str]:
        checked = check_trial({**base, **changes})
        return [] if isinstance(checked, TrialSpec) else [".".join(p.loc) for p in checked]

    assert paths(data={**image, "mixup": {}}) == []
    assert paths(data={**image, "mixup": {}}, batch={"size": 5}) == ["data.mixup"]
    assert paths(data={**image, "mixup": {}}, objective={"kind": "dino", "out_dim": 16}) == ["data.mixup"]
    assert paths(data={**image, "decode_device": "cuda"}, hardware={"device": "cpu"}) == ["data.decode_device"]
    dino = {"kind": "dino", "out_dim": 16}
    assert paths(data={**image, "decode_device": "cuda"}, objective=dino) == ["data.decode_device"]
    assert paths(data={**image, "mixup": {}}, batch={"size": "auto"}) == ["batch.auto_min"]
    assert paths(data={**image, "mixup": {}}, batch={"size": "auto", "auto_min": 2}) == []
    cuda_aa = {**image, "decode_device": "cuda", "augment": {"auto_augment": "rand-m9"}}
    assert paths(data=cuda_aa) == ["data.augment.auto_augment"]
    assert paths(data={**image, "augment": {"auto_augment": "rm -rf"}}) == ["data.augment.auto_augment"]


def test_a_corrupt_jpeg_fails_its_trial_by_name(tmp_path, write_spec, fork_server):
    """In a real trial; the same spec on a sound tree trains (tests/test_workloads.py: the ResNet-50 spec)."""
    broken = tmp_path / "tree"
    demo.write_tree(broken, classes=2, per_class=4, size=(64, 48))
    bad = broken / "n00000000" / "n00000000_0.JPEG"
    bad.write_bytes(bad.read_bytes()[:40])
    text = f"""\
        name: images
        model: {{name: resnet18, img_size: 32}}
        objective: {{num_classes: 2}}
        batch: {{size: 4}}
        data: {{source: image_folder, root: {broken}, decoder: torchvision, augment: {{re_prob: 0.5}}, mixup: {{}}}}
        measure: {{warmup_steps: 1, bench_steps: 2, repeats: 1, ablation: false, timeout_s: 120}}
        """
    (trial,) = grid.expand(spec_file.load(write_spec(text)))
    r = runner.run_trial(trial, tmp_path / "trial", server=fork_server).result
    assert r.status == "error" and str(bad) in r.error and "DataError" in r.error, r.error


def test_an_inc1_policy_is_refused_exactly_where_timm_and_pillow_crash_on_it():
    """timm's level function and Pillow decide; the preflight check (timm's op) must agree with them."""
    from PIL import ImageOps
    from timm.data import auto_augment

    from dinox.plan.preflight import _auto_augment_problem

    bits = auto_augment._posterize_increasing_level_to_arg(auto_augment._LEVEL_DENOM, {})[0]
    try:
        ImageOps.posterize(Image.new("RGB", (8, 8)), bits)
        crashes = False
    except ValueError:
        crashes = True
    problem = _auto_augment_problem("rand-m9-mstd0.5-inc1")
    assert bool(problem) == crashes and ("Pillow" in problem) == crashes
    assert _auto_augment_problem("rand-m9-mstd0.5") == ""


def test_shards_are_written_whole_over_nothing_or_in_place_of_the_old_set_and_stay_inside_the_root(tree, tmp_path):
    """`dinox shards --out` into a folder that held shards kept the old ones and counted them as written;
    a failure halfway left complete-looking shards; --image-folder stored what a link out of the root pointed
    at (a link to /etc/shadow)."""
    import shutil
    import tarfile

    from click.testing import CliRunner

    from dinox.cli.main import main

    def shards(*args: str):
        return CliRunner().invoke(main, ["shards", "--image-folder", *args])

    out = tmp_path / "out"
    n = sum(1 for p in tree.rglob("*") if p.is_file())
    first = shards(str(tree), "--out", str(out), "--shard-size", "1")
    assert first.exit_code == 0 and first.output.strip() == f"wrote {n} shards to {out}", first.output
    small = tmp_path / "small"
    (small / "c0").mkdir(parents=True)
    shutil.copy(next((tree / "n00000000").iterdir()), small / "c0" / "a.jpg")
    again = shards(str(small), "--out", str(out), "--shard-size", "1")
    assert again.exit_code == 2 and f"already holds {n} shard(s) (images-*.tar); --replace writes" in again.stderr
    replaced = shards(str(small), "--out", str(out), "--shard-size", "1", "--replace")
    assert replaced.exit_code == 0 and replaced.output.strip() == f"wrote 1 shard to {out}"
    assert sorted(p.name for p in out.iterdir()) == ["images-000000.tar"]  # the old ones gone, no staging left
    # A file that cannot be read halfway: nothing of this set is left behind.
    broken = tmp_path / "broken"
    shutil.copytree(tree, broken)
    (broken / "n00000001" / "zzz.txt").write_text("the last sample: not an image")
    failed = shards(str(broken), "--out", str(tmp_path / "half"), "--shard-size", "1")
    assert failed.exit_code == 2 and "zzz.txt: not a .jpg" in failed.stderr
    assert list((tmp_path / "half").iterdir()) == []  # none of the shards written before it
    # A link out of the root is refused unless asked for.
    linked = tmp_path / "linked"
    shutil.copytree(tree, linked)
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"not for a shard")
    (linked / "n00000000" / "zz.jpg").symlink_to(secret)
    refused = shards(str(linked), "--out", str(tmp_path / "l"))
    assert refused.exit_code == 2 and "a link out of" in refused.stderr and "--follow-links" in refused.stderr
    followed = shards(str(linked), "--out", str(tmp_path / "l"), "--follow-links")
    assert followed.exit_code == 0
    with tarfile.open(next((tmp_path / "l").glob("*.tar"))) as t:
        assert any(t.extractfile(m).read() == b"not for a shard" for m in t if m.isfile())
