"""ct_png and webdataset samples against pixels computed by hand from the DICOM; synthetic views."""

from __future__ import annotations

import numpy as np
import pydicom
import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.transforms.v2 import functional as F

from dinox.data import dicom_preprocess as pp
from dinox.data.ct_png import CtPngSlices
from dinox.data.files import DataError, shard_layout, write_shards
from dinox.data.synthetic import SyntheticImages
from dinox.data.views import HuWindow, ViewPlan
from dinox.data.webdataset_source import Shards
from tests.conftest import run_dinox
from tests.data.test_dicom_preprocess import demo

LEVEL, WIDTH = -300.0, 1200.0
FIXED = HuWindow((LEVEL, LEVEL), (WIDTH, WIDTH))  # a degenerate range: the window is known exactly


@pytest.fixture(scope="module")
def ct(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct")
    demo.write_series(root / "dicom" / "P1", slices=5, rows=32, cols=32, seed=7)
    pp.preprocess(root / "dicom", root / "png", progress=False)
    # Hand-computed HU per slice, in position order, straight from pydicom.
    slices = [pydicom.dcmread(p) for p in (root / "dicom" / "P1").glob("*.dcm")]
    slices.sort(key=lambda d: float(d.ImagePositionPatient[2]))
    hu = [d.pixel_array.astype(np.float32) * float(d.RescaleSlope) + float(d.RescaleIntercept) for d in slices]
    return root, np.stack(hu)


def expected_window(hu: np.ndarray) -> np.ndarray:
    return np.clip((hu - (LEVEL - WIDTH / 2)) / WIDTH, 0, 1)


@pytest.mark.parametrize("decoder", ["torchvision", "pil"])
def test_ct_png_sample_stacks_neighbours_in_hu_and_windows_them(ct, decoder):
    root, hu = ct
    ds = CtPngSlices(
        str(root / "png" / "_index" / "index.csv"),
        None,
        ViewPlan(full_size=32),
        FIXED,
        decoder=decoder,
        subset_size=None,
        seed=0,
        inflation=1,
        num_classes=10,
    )
    assert len(ds) == 5
    for z in range(5):
        raw = ds.hu(z)
        assert raw.dtype == torch.float32 and raw.shape == (3, 32, 32)
        picks = [max(z - 1, 0), z, min(z + 1, 4)]  # clamped at the series' ends
        np.testing.assert_array_equal(raw.numpy(), hu[picks])
        image, label = ds[z]
        assert image.dtype == torch.float32 and image.shape == (3, 32, 32)
        np.testing.assert_allclose(image.numpy(), expected_window(hu[picks]), atol=1e-6)
        assert 0 <= label < 10


def test_ct_png_resizes_to_the_model_input_and_draws_windows_in_range(ct):
    root, _hu = ct
    window = HuWindow((-700.0, 100.0), (300.0, 2000.0))
    ds = CtPngSlices(
        str(root / "png" / "_index" / "index.csv"),
        None,
        ViewPlan(full_size=48),
        window,
        decoder="torchvision",
        subset_size=None,
        seed=0,
        inflation=1,
        num_classes=10,
    )
    image, _ = ds[2]
    assert image.shape == (3, 48, 48) and 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    draws = {float(ds[2][0].mean()) for _ in range(5)}
    assert len(draws) > 1  # a new random window every time


def test_every_ct_reader_gives_torchvisions_resize_of_the_hu_slices(ct, tmp_path):
    """ct_png (both decoders) and both shard encodings resize a 32 px slice to a 16 px model as torchvision's
    antialiased resize of the HU image does, though they resize the stored values and take the offset off
    the small image (float32 at ~32768 rounds to 1/256 HU)."""
    root, hu = ct
    index = root / "png" / "_index" / "index.csv"
    reference = F.resize(torch.from_numpy(hu), [16, 16], antialias=True).numpy()
    write_shards(index, tmp_path / "raw16", shard_size=5, encoding="raw16")
    write_shards(index, tmp_path / "png16", shard_size=5)
    readers = {
        f"ct_png {decoder}": CtPngSlices(
            str(index), None, ViewPlan(16), FIXED, decoder=decoder, subset_size=None, seed=0, inflation=1, num_classes=2
        )
        for decoder in ("pil", "torchvision")
    }
    for encoding in ("raw16", "png16"):
        readers[encoding] = list(
            Shards(
                str(tmp_path / encoding), ViewPlan(16), FIXED, decoder="pil", shuffle_buffer=0, seed=0, num_classes=2
            )
        )
    for name, reader in readers.items():
        for z in range(5):
            picks = [max(z - 1, 0), z, min(z + 1, 4)]
            image = reader[z][0].numpy()
            assert image.shape == (3, 16, 16), name
            np.testing.assert_allclose(image, expected_window(reference[picks]), atol=0.05 / WIDTH, err_msg=name)
    small = readers["ct_png pil"].hu(0)  # already at the model's size: the windows work on the small image
    assert small.shape == (3, 16, 16) and float(np.abs(small.numpy() - reference[[0, 0, 1]]).max()) < 0.05


def test_subset_and_inflation(ct):
    root, _ = ct
    index = str(root / "png" / "_index" / "index.csv")
    kw = dict(decoder="pil", seed=3, num_classes=10)
    ds = CtPngSlices(index, None, ViewPlan(full_size=32), FIXED, subset_size=2, inflation=1000, **kw)
    assert len(ds) == 2000 and len(ds.slices) == 2
    np.testing.assert_array_equal(ds.hu(0).numpy(), ds.hu(2).numpy())  # the subset repeats, files are not copied
    again = CtPngSlices(index, None, ViewPlan(full_size=32), FIXED, subset_size=2, inflation=1, **kw)
    assert again.slices == ds.slices  # same seed, same subset
    with pytest.raises(DataError, match="data.subset_size: 9 > the 5 slices"):
        CtPngSlices(index, None, ViewPlan(full_size=32), FIXED, subset_size=9, inflation=1, **kw)


def test_dino_views_have_the_crop_sizes(ct):
    root, _ = ct
    plan = ViewPlan(full_size=None, global_count=2, global_size=32, local_count=3, local_size=16)
    ds = CtPngSlices(
        str(root / "png" / "_index" / "index.csv"),
        None,
        plan,
        FIXED,
        decoder="torchvision",
        subset_size=None,
        seed=0,
        inflation=1,
        num_classes=1,
    )
    views, _ = ds[1]
    assert [tuple(v.shape) for v in views] == [(3, 32, 32)] * 2 + [(3, 16, 16)] * 3
    batch = next(iter(DataLoader(ds, batch_size=2)))
    assert [tuple(v.shape) for v in batch[0]] == [(2, 3, 32, 32)] * 2 + [(2, 3, 16, 16)] * 3


def test_corrupt_png_names_the_file(ct, tmp_path):
    root, _ = ct
    import shutil

    copy = tmp_path / "png"
    shutil.copytree(root / "png", copy)
    victim = sorted(copy.rglob("00002.png"))[0]
    victim.write_bytes(victim.read_bytes()[:40])
    ds = CtPngSlices(
        str(copy / "_index" / "index.csv"),
        None,
        ViewPlan(full_size=32),
        FIXED,
        decoder="torchvision",
        subset_size=None,
        seed=0,
        inflation=1,
        num_classes=1,
    )
    with pytest.raises(DataError, match=f"cannot decode {victim}"):
        ds[2]


def test_index_that_is_not_an_index(tmp_path):
    (tmp_path / "index.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="missing columns png_path, series_dir, slice_index"):
        CtPngSlices(
            str(tmp_path / "index.csv"),
            None,
            ViewPlan(full_size=8),
            FIXED,
            decoder="pil",
            subset_size=None,
            seed=0,
            inflation=1,
            num_classes=1,
        )


@pytest.mark.parametrize("decoder", ["torchvision", "pil"])
def test_webdataset_shards_carry_the_same_pixels(ct, tmp_path, decoder):
    root, hu = ct
    proc = run_dinox(
        [
            "shards",
            "--index-csv",
            str(root / "png" / "_index" / "index.csv"),
            "--out",
            str(tmp_path / "shards"),
            "--shard-size",
            "2",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote 3 shards to {tmp_path / 'shards'}"
    ds = Shards(
        str(tmp_path / "shards"),
        ViewPlan(full_size=32),
        FIXED,
        decoder=decoder,
        shuffle_buffer=0,
        seed=0,
        num_classes=10,
    )
    images = [img for img, _ in ds]
    assert len(images) == 5
    for z, image in enumerate(images):  # unshuffled: shard order, then sample order
        picks = [max(z - 1, 0), z, min(z + 1, 4)]
        assert image.dtype == torch.float32 and image.shape == (3, 32, 32)
        np.testing.assert_allclose(image.numpy(), expected_window(hu[picks]), atol=1e-6)


def test_raw16_shards_hold_the_same_slices_uncompressed(ct, tmp_path):
    root, hu = ct
    index = root / "png" / "_index" / "index.csv"
    write_shards(index, tmp_path / "png16", shard_size=5)
    write_shards(index, tmp_path / "raw16", shard_size=5, encoding="raw16")
    layouts = [shard_layout(str(tmp_path / encoding / "ct-000000.tar")) for encoding in ("png16", "raw16")]
    assert layouts == ["png16", "raw16"]
    ds = Shards(
        str(tmp_path / "raw16"), ViewPlan(full_size=32), FIXED, decoder="pil", shuffle_buffer=0, seed=0, num_classes=10
    )
    for z, (image, _label) in enumerate(ds):
        picks = [max(z - 1, 0), z, min(z + 1, 4)]
        np.testing.assert_allclose(image.numpy(), expected_window(hu[picks]), atol=1e-6)


def test_webdataset_splits_shards_across_workers(ct, tmp_path):
    root, _ = ct
    write_shards(root / "png" / "_index" / "index.csv", tmp_path / "s", shard_size=1)
    ds = Shards(
        str(tmp_path / "s"),
        ViewPlan(full_size=32),
        FIXED,
        decoder="torchvision",
        shuffle_buffer=4,
        seed=0,
        num_classes=10_000,
    )
    # 5 shards over 3 workers: every sample exactly once per epoch, none duplicated across workers.
    labels = [int(y) for _x, ys in DataLoader(ds, batch_size=1, num_workers=3) for y in ys]
    assert sorted(labels) == sorted((0 * 7919 + z) % 10_000 for z in range(5))


def test_a_trial_s_stream_repeats_its_shards_and_a_worker_without_one_ends(ct, tmp_path):
    """5 samples in 5 shards: a trial's stream goes on past them (no epoch ends inside its windows); of 8
    workers, the 3 without a shard end at once instead of spinning."""
    import itertools

    root, _ = ct
    write_shards(root / "png" / "_index" / "index.csv", tmp_path / "s", shard_size=1)
    kw = dict(decoder="pil", shuffle_buffer=0, seed=0, num_classes=10_000, repeat=True)
    ds = Shards(str(tmp_path / "s"), ViewPlan(full_size=8), FIXED, **kw)
    labels = [int(y) for _x, y in itertools.islice(ds, 12)]
    assert labels == [z % 5 for z in range(12)]  # slice z of series 0: label z, pass after pass
    loader = DataLoader(ds, batch_size=1, num_workers=8, persistent_workers=False)
    assert len(list(itertools.islice(loader, 20))) == 20


def test_a_small_map_style_set_is_repeated_to_what_the_measurement_draws():
    from dinox.data import Pipeline, repeat_to

    small = repeat_to(Pipeline(SyntheticImages(56, 3, ViewPlan(full_size=8), 5, 0)), samples_needed=400)
    assert (small.repeats, small.samples, len(small.dataset)) == (8, 56, 448)  # type: ignore[arg-type]
    assert torch.equal(small.dataset[3][0], small.dataset[56 + 3][0])
    big = repeat_to(Pipeline(SyntheticImages(1000, 3, ViewPlan(full_size=8), 5, 0)), samples_needed=400)
    assert big.repeats == 1 and len(big.dataset) == 1000  # type: ignore[arg-type]


def test_missing_shards_are_named(tmp_path):
    with pytest.raises(DataError, match="no .tar shards found"):
        Shards(str(tmp_path), ViewPlan(full_size=8), FIXED, decoder="pil", shuffle_buffer=0, seed=0, num_classes=1)
    with pytest.raises(DataError, match=r"ct-000000.tar does not exist \(2 of 2 shards missing\)"):
        Shards(
            str(tmp_path / "ct-{000000..000001}.tar"),
            ViewPlan(full_size=8),
            FIXED,
            decoder="pil",
            shuffle_buffer=0,
            seed=0,
            num_classes=1,
        )


def test_synthetic_views():
    plan = ViewPlan(full_size=None, global_count=2, global_size=16, local_count=2, local_size=8)
    views, label = SyntheticImages(4, 3, plan, 5, 0)[1]
    assert [tuple(v.shape) for v in views] == [(3, 16, 16)] * 2 + [(3, 8, 8)] * 2 and 0 <= label < 5
    image, _ = SyntheticImages(4, 1, ViewPlan(full_size=12), 5, 0)[0]
    assert image.shape == (1, 12, 12)


def test_shards_over_http_are_read_without_a_subprocess(ct, tmp_path, monkeypatch):
    """http(s) shards go through urllib in-process: webdataset's curl subprocess is never started."""
    import functools
    import http.server
    import subprocess
    import threading

    root, hu = ct
    write_shards(root / "png" / "_index" / "index.csv", tmp_path / "web", shard_size=2)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "web"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"a subprocess was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/ct-{{000000..000002}}.tar"
        ds = Shards(url, ViewPlan(full_size=32), FIXED, decoder="pil", shuffle_buffer=0, seed=0, num_classes=10)
        images = [img for img, _ in ds]
    finally:
        server.shutdown()
    assert len(images) == 5
    np.testing.assert_allclose(images[2].numpy(), expected_window(hu[[1, 2, 3]]), atol=1e-6)


@pytest.mark.parametrize("shards", ["pipe:touch /tmp/dinox-pwned; #://", "{pipe:id,a}.tar", "gs://b/a.tar"])
def test_a_hand_written_trial_cannot_reach_a_shell_either(shards):
    """The spec refuses these at validation; the reader refuses them again (a trial.json written by hand)."""
    with pytest.raises(DataError, match="is not accepted"):
        Shards(shards, ViewPlan(full_size=8), FIXED, decoder="pil", shuffle_buffer=0, seed=0, num_classes=1)


def test_sample_preparation_runs_on_one_intra_op_thread(monkeypatch):
    """In the main process (0 workers) a sample's ops must not take the trial's threads: they thrash when a
    core is busy (ct_png at 224 px with one core busy: 64 img/s on 2 threads, 156 on 1)."""
    seen: list[int] = []
    real = torch.randint

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "randint", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        image, _label = SyntheticImages(2, 3, ViewPlan(full_size=8), 5, 0)[0]
        assert seen == [1, 1] and torch.get_num_threads() == 2  # one thread inside, the trial's again after
        assert image.dtype == torch.uint8 and image.shape == (3, 8, 8)  # as a decoder yields it
    finally:
        torch.set_num_threads(before)
    image, _label = SyntheticImages(2, 3, ViewPlan(full_size=8), 5, 0, pixels="float32")[0]
    assert image.dtype == torch.float32


def test_synthetic_uint8_is_normalised_on_the_device_as_timm_s_loader_does():
    """The device batch is float, ImageNet-normalised: (x / 255 - mean) / std, per channel."""
    from dinox.data.device_prep import MEAN, STD, DevicePrep
    from dinox.spec.data_sources import SyntheticData

    prep = DevicePrep(SyntheticData(), torch.device("cpu"), 8, 10)
    batch = torch.full((2, 3, 8, 8), 255, dtype=torch.uint8)
    out = prep.images(batch)
    assert out.dtype == torch.float32
    assert out[0, :, 0, 0].tolist() == pytest.approx([(1 - m) / s for m, s in zip(MEAN, STD, strict=True)])
    one = DevicePrep(SyntheticData(), torch.device("cpu"), 8, 10, channels=1).images(batch[:, :1])
    assert one.shape == (2, 1, 8, 8) and prep.mixup is None and prep.erase is None


@pytest.mark.parametrize("planted", ["absolute", "dotdot"])
def test_an_index_that_names_files_outside_its_root_is_refused_by_dinox_shards(ct, tmp_path, planted):
    """An index (shared, downloaded) once carried /etc/shadow-like paths, or ../ ones, into shards anyone
    with the shards could read. It names files under its root only; --root says where that is."""
    import shutil

    from tests.conftest import run_dinox

    root, _hu = ct
    png = tmp_path / "png"
    shutil.copytree(root / "png", png)
    secret = tmp_path / "secret.txt"
    secret.write_text("the team's token\n")
    index = png / "_index" / "index.csv"
    rows = index.read_text().splitlines()
    series = rows[1].split(",")[1]
    bad = str(secret) if planted == "absolute" else "../secret.txt"
    index.write_text("\n".join([*rows, f"{bad},{series},99"]) + "\n")
    out = tmp_path / "shards"
    proc = run_dinox(["shards", "--index-csv", str(index), "--out", str(out)], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = len(rows) + 1
    assert proc.stderr.startswith(f"error: {index}:{line}: png_path {bad!r} lies outside the index's root"), proc.stderr
    assert "Traceback" not in proc.stderr and not any(out.glob("*.tar"))


def test_a_shard_folder_is_one_whole_set_or_refused(ct, tmp_path):
    """A `dinox shards --replace` killed while moving its set into place once left old and new samples side
    by side that read as one set; shards of another prefix written into a folder said nothing. The marker a
    kill leaves makes every reader refuse the folder until a --replace completes it; another prefix is
    refused."""
    from tests.conftest import run_dinox

    root, _hu = ct
    index = root / "png" / "_index" / "index.csv"
    out = tmp_path / "sh"
    first = ["shards", "--index-csv", str(index), "--out", str(out), "--shard-size", "2"]
    assert run_dinox(first, tmp_path).returncode == 0
    spec = tmp_path / "w.yaml"
    spec.write_text(
        "name: w\nmodel: {name: resnet18, img_size: 32}\nbatch: {size: 2}\n"
        f"data: {{source: webdataset, shards: {out}}}\n"
    )
    assert run_dinox(["validate", str(spec)], tmp_path).returncode == 0
    (out / ".dinox-shards-incomplete").write_text("dinox shards was moving 3 ct-*.tar into place\n")  # a kill's
    proc = run_dinox(["validate", str(spec)], tmp_path)
    assert proc.returncode == 2 and "holds an incomplete shard set (a dinox shards run was stopped" in proc.stderr
    again = ["shards", "--index-csv", str(index), "--out", str(out), "--shard-size", "2", "--replace"]
    assert run_dinox(again, tmp_path).returncode == 0
    assert not (out / ".dinox-shards-incomplete").exists()
    assert run_dinox(["validate", str(spec)], tmp_path).returncode == 0

    (tmp_path / "imgs" / "a").mkdir(parents=True)
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "imgs" / "a" / "x.jpg")
    mixed = run_dinox(["shards", "--image-folder", str(tmp_path / "imgs"), "--out", str(out)], tmp_path)
    assert mixed.returncode == 2 and "holds other shards (ct-000000.tar and more)" in mixed.stderr, mixed.stderr
    assert not list(out.glob("images-*.tar"))
