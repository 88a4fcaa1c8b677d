"""GLUE metrics against scikit-learn and SciPy; SQuAD v1.1 scores against a second,
independent implementation of the official script's definitions written here."""

import math
import re
import string
import types
import warnings

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from concise_attention.training.tasks import metrics

TOLERANCE = 1e-9


def _binary_cases():
    rng = np.random.default_rng(0)
    cases = [(rng.integers(0, 2, 40), rng.integers(0, 2, 40)) for _ in range(5)]
    labels = rng.integers(0, 2, 30)
    cases += [
        (labels, np.ones(30, int)),  # constant prediction, positive
        (labels, np.zeros(30, int)),  # constant prediction, negative: no true positive
        (labels, labels.copy()),  # perfect
        (labels, 1 - labels),  # all wrong
        (np.zeros(8, int), np.zeros(8, int)),  # positive class absent everywhere
        (np.array([1]), np.array([0])),
    ]
    return cases


@pytest.mark.parametrize("labels, predictions", _binary_cases())
def test_binary_metrics_equal_scikit_learn(labels, predictions):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn warns on its 0.0 of undefined cases
        expected_f1 = sklearn.metrics.f1_score(labels, predictions, pos_label=1, zero_division=0.0)
        expected_mcc = sklearn.metrics.matthews_corrcoef(labels, predictions)
    assert metrics.accuracy(labels, predictions) == pytest.approx(
        sklearn.metrics.accuracy_score(labels, predictions), abs=TOLERANCE
    )
    assert metrics.f1(labels, predictions) == pytest.approx(expected_f1, abs=TOLERANCE)
    assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(expected_mcc, abs=TOLERANCE)
    assert all(
        type(value) is float for value in (metrics.accuracy(labels, predictions), metrics.f1(labels, predictions))
    )


def test_f1_of_named_positive_class_and_multiclass_mcc_equal_scikit_learn():
    rng = np.random.default_rng(1)
    names = np.array(["not_equivalent", "equivalent"])
    labels, predictions = names[rng.integers(0, 2, 50)], names[rng.integers(0, 2, 50)]
    expected = sklearn.metrics.f1_score(labels, predictions, pos_label="equivalent")
    assert metrics.f1(labels, predictions, positive_label="equivalent") == pytest.approx(expected, abs=TOLERANCE)
    for seed in range(4):
        rng = np.random.default_rng(seed)
        labels, predictions = rng.integers(0, 3, 60), rng.integers(0, 3, 60)
        predictions[:20] = labels[:20]  # some signal, so MCC is not ~0
        expected = sklearn.metrics.matthews_corrcoef(labels, predictions)
        assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(expected, abs=TOLERANCE)
    assert metrics.matthews_corrcoef([0, 1, 1, 0], [1, 1, 1, 1]) == 0.0


def _correlation_cases():
    rng = np.random.default_rng(2)
    x = rng.normal(size=40)
    cases = [(x, 0.5 * x + rng.normal(size=40)) for _ in range(3)]
    cases.append((x, -x))
    scores = rng.integers(0, 6, 40).astype(float)  # STS-B-like scores with many ties
    cases.append((scores, np.round(scores + rng.normal(size=40), 0)))
    cases.append((np.array([1.0, 2.0, 2.0, 3.0, 3.0, 3.0]), np.array([3.0, 1.0, 1.0, 2.0, 5.0, 5.0])))
    cases.append((np.array([1e6 + 1, 1e6 + 2, 1e6 + 4]), np.array([0.1, 0.3, 0.2])))
    return cases


@pytest.mark.parametrize("x, y", _correlation_cases())
def test_correlations_equal_scipy(x, y):
    assert metrics.pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y).statistic, abs=TOLERANCE)
    assert metrics.spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y).statistic, abs=TOLERANCE)
    assert type(metrics.pearson(x, y)) is float and type(metrics.spearman(x, y)) is float


def test_correlation_of_a_constant_is_nan_as_scipy():
    x, constant = np.array([0.1, 0.5, 0.9, 0.2]), np.full(4, 3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SciPy's ConstantInputWarning
        assert math.isnan(scipy.stats.pearsonr(x, constant).statistic)
        assert math.isnan(scipy.stats.spearmanr(x, constant).statistic)
    assert math.isnan(metrics.pearson(x, constant)) and math.isnan(metrics.spearman(constant, x))


def test_average_ranks_equal_scipy_rankdata():
    values = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5])
    np.testing.assert_array_equal(metrics.average_ranks(values), scipy.stats.rankdata(values, method="average"))


@pytest.mark.parametrize(
    "call",
    [
        lambda: metrics.accuracy([1, 0, 1], [1, 0]),
        lambda: metrics.f1([], []),
        lambda: metrics.pearson([[1.0, 2.0]], [[1.0, 2.0]]),
        lambda: metrics.exact_match("x", []),
        lambda: metrics.squad_scores({}, []),
    ],
)
def test_bad_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


# --- SQuAD v1.1: a second implementation of the published definitions --------------

_REFERENCE_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _reference_normalize(text):
    text = text.lower().translate(_REFERENCE_PUNCTUATION)
    text = re.sub(r"\b(?:a|an|the)\b", " ", text)
    return re.sub(r"\s+", " ", text).strip()


def _reference_f1(prediction, truth):
    predicted, true = _reference_normalize(prediction).split(), _reference_normalize(truth).split()
    remaining = {}
    for token in true:
        remaining[token] = remaining.get(token, 0) + 1
    common = 0
    for token in predicted:
        if remaining.get(token, 0) > 0:
            remaining[token] -= 1
            common += 1
    # 2PR/(P+R) with P = common/|pred|, R = common/|true| is 2 common / (|pred| + |true|).
    return 2 * common / (len(predicted) + len(true)) if common else 0.0


_SQUAD_CASES = [
    ("The Eiffel Tower", ["eiffel tower"]),
    ("Eiffel-Tower!", ["Eiffel Tower"]),
    ("an apple a day", ["apple day", "An apple"]),
    ("theatre of the absurd", ["theatre absurd"]),
    ("  Denver   Broncos\n", ["Denver Broncos"]),
    ("Café naïve", ["cafe naive", "Café  Naïve."]),
    ("“quoted” — text", ["quoted text"]),
    ("Ünïcödé Straße", ["ÜNÏCÖDÉ STRASSE"]),
    ("", ["something"]),
    ("", [""]),
    ("the", ["a"]),
    ("1,000 (approx.)", ["1000 approx"]),
    ("cat cat dog", ["cat dog dog"]),
    ("A.B.C.", ["abc"]),
    ("Beyoncé's album", ["beyonces album", "album"]),
    ("over the top", ["over-the-top", "top"]),
]


@pytest.mark.parametrize("prediction, truths", _SQUAD_CASES)
def test_squad_normalisation_and_scores_equal_the_reference(prediction, truths):
    for text in [prediction, *truths]:
        assert metrics.normalize_answer(text) == _reference_normalize(text)
    expected_exact = max(float(_reference_normalize(prediction) == _reference_normalize(t)) for t in truths)
    expected_f1 = max(_reference_f1(prediction, t) for t in truths)
    assert metrics.exact_match(prediction, truths) == expected_exact
    assert metrics.f1_score(prediction, truths) == pytest.approx(expected_f1, abs=TOLERANCE)


def test_squad_hand_computed_values():
    assert metrics.normalize_answer("The  Cat, sat!") == "cat sat"
    # prediction {cat, sat}, truth {cat, sat, on, mat}: P = 1, R = 1/2, F1 = 2/3.
    assert metrics.f1_score("the cat sat", ["a cat sat on the mat"]) == pytest.approx(2 / 3, abs=TOLERANCE)
    assert metrics.f1_score("", [""]) == 0.0 and metrics.exact_match("", [""]) == 1.0


def test_squad_scores_are_percentages_over_all_questions():
    examples = [
        types.SimpleNamespace(id="q1", answers=[("Denver Broncos", 177), ("the Denver Broncos", 173)]),
        types.SimpleNamespace(id="q2", answers=[("Santa Clara, California", 403)]),
        types.SimpleNamespace(id="q3", answers=[("gold", 488)]),  # left unanswered: scores 0
    ]
    predictions = {"q1": "Denver Broncos", "q2": "Santa Clara", "unknown": "ignored"}
    scores = metrics.squad_scores(predictions, examples)
    # q1: exact; q2: P = 1, R = 2/3, F1 = 0.8; q3: 0.
    assert scores["exact_match"] == pytest.approx(100 / 3, abs=TOLERANCE)
    assert scores["f1"] == pytest.approx(100 * (1 + 0.8) / 3, abs=TOLERANCE)


def test_squad_scores_equal_tf_models_port_of_the_official_script():
    """tf-models-official's squad_evaluate_v1_1 (fractions, where the official script prints percent)."""
    from official.nlp.tools import squad_evaluate_v1_1

    qas = [
        {"id": f"q{index}", "answers": [{"text": truth, "answer_start": 0} for truth in truths]}
        for index, (_, truths) in enumerate(_SQUAD_CASES)
    ]
    predictions = {f"q{index}": prediction for index, (prediction, _) in enumerate(_SQUAD_CASES) if index != 3}
    reference = squad_evaluate_v1_1.evaluate([{"paragraphs": [{"qas": qas}]}], predictions)
    examples = [types.SimpleNamespace(id=qa["id"], answers=[(a["text"], 0) for a in qa["answers"]]) for qa in qas]
    scores = metrics.squad_scores(predictions, examples)
    assert scores["exact_match"] == pytest.approx(100 * reference["exact_match"], abs=TOLERANCE)
    assert scores["f1"] == pytest.approx(100 * reference["final_f1"], abs=TOLERANCE)
