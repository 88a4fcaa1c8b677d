"""A deep single-head LM with Admin trains on the shipped real-text corpus."""

import numpy as np
import pytest

from concise_attention.training.trainers.lm import fit_language_model
from concise_attention.training.data.packing import pack_sentences
from concise_attention.training.data.packing import read_lines
from concise_attention.training.preprocessing.tokenizer import train_wordpiece
from concise_attention.training.preprocessing.tokenizer import wordpiece_tokenizer
from concise_attention.training.run import configs


@pytest.fixture(scope="module")
def packed_corpus(tmp_path_factory):
    lines = read_lines()
    tokenizer = wordpiece_tokenizer(train_wordpiece(lines, 2000, tmp_path_factory.mktemp("vocab") / "vocab.txt"))
    return tokenizer.vocabulary_size(), pack_sentences([np.asarray(ids).tolist() for ids in tokenizer(lines)], 64)


def test_wordpiece_vocabulary_is_cached(tmp_path):
    lines = read_lines()[:200]
    path = train_wordpiece(lines, 500, tmp_path / "vocab.txt")
    stamp = path.stat().st_mtime_ns
    assert train_wordpiece(lines, 500, path).stat().st_mtime_ns == stamp  # same corpus and size: reused
    assert path.read_text().splitlines()[:5] == ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]


def test_a_vocabulary_trained_once_on_this_machine_is_copied_not_trained_again(tmp_path, monkeypatch):
    """The per-user cache (CONCISE_ATTENTION_CACHE): the same lines, size and settings in another run directory
    are copied from it; other settings, or a cached copy that no longer matches its sha256, train again (and
    give the vocabulary trained first: the trainer is deterministic); a cache that cannot be written warns."""
    import keras_hub

    from concise_attention.training.preprocessing import tokenizer as tokenizer_module

    trained, compute = [], keras_hub.tokenizers.compute_word_piece_vocabulary
    monkeypatch.setattr(
        keras_hub.tokenizers, "compute_word_piece_vocabulary", lambda *a, **k: trained.append(1) or compute(*a, **k)
    )
    monkeypatch.setenv("CONCISE_ATTENTION_CACHE", str(tmp_path / "cache"))
    lines = read_lines()[:200]
    first = train_wordpiece(lines, 500, tmp_path / "a" / "vocab.txt").read_text()
    assert train_wordpiece(lines, 500, tmp_path / "b" / "vocab.txt").read_text() == first and len(trained) == 1
    assert (
        train_wordpiece(lines, 500, tmp_path / "c" / "vocab.txt", lowercase=False).read_text() != first
        and len(trained) == 2
    )
    [cached] = [path for path in (tmp_path / "cache" / "vocabularies").glob("*.txt") if path.read_text() == first]
    cached.write_text(first.replace("[MASK]", "[MASQ]"))
    assert train_wordpiece(lines, 500, tmp_path / "d" / "vocab.txt").read_text() == first and len(trained) == 3
    (tmp_path / "not_a_folder").write_text("")
    monkeypatch.setenv("CONCISE_ATTENTION_CACHE", str(tmp_path / "not_a_folder"))
    with pytest.warns(UserWarning, match="could not be written"):
        assert train_wordpiece(lines, 500, tmp_path / "e" / "vocab.txt").read_text() == first
    assert tokenizer_module.RESERVED_TOKENS == first.splitlines()[:5]


@pytest.mark.slow
def test_deep_single_head_with_admin_trains_without_diverging(packed_corpus):
    vocabulary_size, packed = packed_corpus
    config = configs.load_config(
        "tiny_lm_deep_single_head_admin", [f"model.vocab_size={vocabulary_size}", "model.dropout=0"]
    )
    model = config.build_model()
    variances = model.initialize_admin({name: value[:16] for name, value in packed.items()})
    assert len(variances) == 2 * config.model.num_layers
    # 120 steps (most of the time is the first trace of 16 layers): the loss falls 7.17 -> 5.53, past the warm-up
    # and 90 steps at the full learning rate.
    losses = fit_language_model(model, packed, steps=120, learning_rate=1e-3, warmup_steps=30, jit_compile=False)
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.7, losses  # it learns the text, it does not merely survive
    assert max(losses[len(losses) // 2 :]) < losses[0]  # and never climbs back up
