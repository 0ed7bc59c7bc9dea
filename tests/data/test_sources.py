"""The CIFAR-10 loader on small files in the original python-pickle layout."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from mtbench.data.cifar10 import CIFAR10, load_train
from mtbench.data.cifar10_files import TRAIN_FILES
from mtbench.errors import DataError


def write_cifar(root, per_batch=4, seed=0):
    """Five training batches, a test batch and batches.meta, as the real set has them (but tiny)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for name in TRAIN_FILES + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, per_batch)],
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"{i}.png".encode() for i in range(per_batch)],
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"class{i}".encode() for i in range(10)], b"num_vis": 3072}, f)
    return folder


def test_loader_reads_the_real_layout(tmp_path):
    folder = write_cifar(tmp_path)
    images, labels, names = load_train(str(tmp_path))
    assert images.shape == (20, 3, 32, 32) and images.dtype == np.uint8
    with open(folder / "data_batch_1", "rb") as f:
        first = pickle.load(f, encoding="bytes")
    # channel-major rows: the first 1024 bytes are the red plane of image 0
    assert np.array_equal(images[0, 0].reshape(-1), first[b"data"][0, :1024])
    assert labels[:4].tolist() == first[b"labels"]
    assert names[3] == "class3"


def test_batches_are_normalized_and_cycle_when_the_set_is_small(tmp_path):
    write_cifar(tmp_path, per_batch=1)
    batches = CIFAR10(str(tmp_path)).image_batches(4, 3, (3, 32, 32), 10, seed=0)
    assert len(batches) == 3
    x, y = batches[0]
    assert x.shape == (4, 3, 32, 32) and y.shape == (4,)
    assert -3 < float(x.min()) and float(x.max()) < 3


def test_missing_file_names_the_file(tmp_path):
    folder = write_cifar(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(DataError, match="data_batch_3"):
        load_train(str(tmp_path))


@pytest.mark.parametrize("content", [b"not a pickle", pickle.dumps([1, 2, 3]), pickle.dumps({b"data": 5})])
def test_corrupt_file_names_the_file(tmp_path, content):
    folder = write_cifar(tmp_path)
    (folder / "data_batch_2").write_bytes(content)
    with pytest.raises(DataError, match="data_batch_2"):
        load_train(str(tmp_path))


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    folder = write_cifar(tmp_path)
    (folder / "batches.meta").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(DataError, match="batches.meta"):
        load_train(str(tmp_path))


def test_a_job_trains_on_cifar10_files(run, tmp_path):
    write_cifar(tmp_path / "data")
    s = run(["model=squeezenet", "batch=4", "data=cifar10", f"data.root={tmp_path / 'data'}"])
    assert s["success"], s["failure"]
    assert s["data"] == f"cifar10:{tmp_path / 'data'}"


def test_cifar10_resized_to_image_size(tmp_path):
    write_cifar(tmp_path, per_batch=2)
    (x, y), = CIFAR10(str(tmp_path), image_size=64).image_batches(3, 1, (3, 64, 64), 10, seed=0)
    assert x.shape == (3, 3, 64, 64) and y.shape == (3,)
    (small, _), = CIFAR10(str(tmp_path)).image_batches(3, 1, (3, 32, 32), 10, seed=0)
    # bilinear 2x up-sampling keeps each image's mean
    assert torch.allclose(x.mean(dim=(2, 3)), small.mean(dim=(2, 3)), atol=0.05)


def test_synthetic_images_follow_image_size():
    from mtbench.data.synthetic import Synthetic

    (x, y), = Synthetic(image_size=224).image_batches(2, 1, (3, 224, 224), 10, seed=0)
    assert x.shape == (2, 3, 224, 224)


@pytest.mark.parametrize("make", ["synthetic", "cifar10"])
def test_a_model_of_another_size_is_told_which_to_set(tmp_path, make):
    from mtbench.data.synthetic import Synthetic
    from mtbench.errors import UsageError

    write_cifar(tmp_path)
    source = Synthetic(image_size=224) if make == "synthetic" else CIFAR10(str(tmp_path), image_size=224)
    with pytest.raises(UsageError, match=r"^data.image_size=224 gives 224x224 images, but this model takes 3x32x32; "
                                         r"allowed: data.image_size=32$"):
        source.image_batches(2, 1, (3, 32, 32), 10, seed=0)


@pytest.mark.parametrize("value", [0, "big", 1.5])
def test_bad_image_size_is_one_line(value):
    from mtbench.data.synthetic import Synthetic
    from mtbench.errors import UsageError

    with pytest.raises(UsageError, match=r"^data.image_size="):
        Synthetic(image_size=value)


def test_cnn_summary_records_224_inputs(run):
    # squeezenet's CIFAR form on 224x224 synthetic images: the input shape follows data.image_size
    s = run(["model=squeezenet", "batch=1", "data.image_size=224"])
    assert s["success"], s["failure"]
    assert s["input_shape"] == [3, 224, 224]
    assert s["config"]["model"]["workload"]["input_shape"] == [3, 224, 224]
