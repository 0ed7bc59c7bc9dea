"""Malformed or planted real-data files end in one line naming the file, the field and what was expected
(exit 2 through the command line), never a job error, a traceback or a hang."""
from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from mtbench.data.cifar10 import load_train
from mtbench.data.squad import SQuAD
from mtbench.data.shakespeare import Shakespeare
from mtbench.errors import DataError
from mtbench.planning.planner import read_budget_file
from mtbench.regular_files import RefusedFile
from tests.conftest import mtbench_cli
from tests.data.test_sources import write_cifar


def rewrite(path, change):
    with open(path, "rb") as f:
        obj = pickle.load(f, encoding="bytes")
    change(obj)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


@pytest.mark.parametrize("name, change, field", [
    ("data_batch_2", lambda b: b.__setitem__(b"labels", b"abc"), "b'labels'"),
    ("data_batch_2", lambda b: b.__setitem__(b"labels", [[1, 2], [3, 4], [5, 6], [7, 8]]), "b'labels'"),
    ("data_batch_2", lambda b: b.__setitem__(b"labels", [1.5, 2, 3, 4]), "b'labels'"),
    ("batches.meta", lambda b: b.__setitem__(b"label_names", 5), "b'label_names'"),
    ("batches.meta", lambda b: b.__setitem__(b"label_names", [1, 2]), "b'label_names'"),
])
def test_malformed_cifar_fields_name_the_file_and_field(tmp_path, name, change, field):
    folder = write_cifar(tmp_path)
    rewrite(folder / name, change)
    with pytest.raises(DataError) as err:
        load_train(str(tmp_path))
    message = str(err.value)
    assert str(folder / name) in message and field in message and "\n" not in message, message


def test_an_empty_cifar_batch_says_it_holds_no_images(tmp_path):
    folder = write_cifar(tmp_path)
    for name in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"]:
        rewrite(folder / name, lambda b: (b.__setitem__(b"data", np.zeros((0, 3072), np.uint8)),
                                          b.__setitem__(b"labels", []), b.__setitem__(b"filenames", [b""])))
    images, labels, _ = load_train(str(tmp_path))  # not "refusing to load __builtin__.bytes"
    assert len(images) == 0 and len(labels) == 0


@pytest.mark.parametrize("text, expected", [
    ('{"data": [{"paragraphs": [{"context": "a b c", "qas": [{"question": "q", "answers": [{"text": "a", '
     '"answer_start": 1e400}]}]}]}]}', "answer_start"),
    ("[" * 100_000 + "]" * 100_000, "nested"),
])
def test_malformed_squad_names_the_file(tmp_path, text, expected):
    path = tmp_path / "train-v1.1.json"
    path.write_text(text)
    with pytest.raises(DataError) as err:
        SQuAD(str(path)).squad_examples(4, seed=0)
    message = str(err.value)
    assert str(path) in message and expected in message and "\n" not in message, message


def test_a_fifo_as_a_data_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "input.txt"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="is a FIFO, not a regular file"):
        Shakespeare(str(fifo)).char_corpus(100, seed=0)


def test_a_fifo_under_the_cifar_root_is_refused_without_blocking(tmp_path):
    folder = write_cifar(tmp_path)
    (folder / "data_batch_4").unlink()
    os.mkfifo(folder / "data_batch_4")
    with pytest.raises(DataError, match="data_batch_4 is a FIFO"):
        load_train(str(tmp_path))


def test_a_link_as_a_data_file_is_refused_and_says_where_it_points(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("hello world " * 50)
    link = tmp_path / "input.txt"
    link.symlink_to(real)
    with pytest.raises(DataError, match=f"is a symbolic link, refused .give the file it points to: {real}"):
        Shakespeare(str(link)).char_corpus(100, seed=0)


def test_a_fifo_as_the_budget_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "budget"
    os.mkfifo(fifo)
    with pytest.raises(RefusedFile, match="is a FIFO"):
        read_budget_file(fifo)


@pytest.mark.parametrize("text", ["1e400", "inf", "-inf", "nan"])
def test_a_budget_that_overflows_is_a_value_error_not_an_overflow(tmp_path, text):
    path = tmp_path / "budget"
    path.write_text(text)
    with pytest.raises(ValueError, match="not a budget|must be > 0"):
        read_budget_file(path)


@pytest.mark.slow
def test_a_job_over_a_malformed_squad_file_is_one_line(tmp_path):
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps({"data": [{"paragraphs": 5}]}))
    proc = mtbench_cli("model=bidaf", "data=squad", f"data.path={path}", "batch=1", "steps=1", "warmup=0",
                       "device=cpu", f"hydra.run.dir={tmp_path / 'run'}", f"lock_dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], lines
