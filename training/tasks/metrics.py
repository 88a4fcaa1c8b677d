"""Evaluation metrics of GLUE and SQuAD v1.1, in plain Python and NumPy.

Classification and correlation metrics follow their textbook definitions (the same ones
scikit-learn and SciPy implement, which the tests use as references). The SQuAD
functions follow the official v1.1 evaluation script's published definitions:
answers are normalised (lower case, punctuation and the articles a/an/the removed,
whitespace collapsed), a question scores the best match over its ground truths, and
the totals are percentages over all questions, unanswered ones counting zero.
"""

import collections
import re
import string

import numpy as np


def _paired(labels, predictions, first="labels", second="predictions"):
    """Both sequences as 1-D arrays of one common length (at least 1)."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    if labels.ndim != 1 or predictions.ndim != 1:
        raise ValueError(f"{first} and {second} must be 1-D. Received: shapes {labels.shape} and {predictions.shape}")
    if len(labels) != len(predictions):
        raise ValueError(
            f"{first} and {second} must have the same length. Received: {len(labels)} and {len(predictions)}"
        )
    if len(labels) == 0:
        raise ValueError(f"{first} and {second} must not be empty.")
    return labels, predictions


def accuracy(labels, predictions):
    """Fraction of predictions equal to their label."""
    labels, predictions = _paired(labels, predictions)
    return float(np.mean(labels == predictions))


def f1(labels, predictions, positive_label=1):
    """Binary F1 of the `positive_label` class (GLUE MRPC and QQP).

    F1 = 2 TP / (2 TP + FP + FN); 0.0 when the positive class is neither predicted nor
    present (scikit-learn's value for that undefined case).
    """
    labels, predictions = _paired(labels, predictions)
    is_positive_label, is_positive_prediction = labels == positive_label, predictions == positive_label
    true_positives = int(np.sum(is_positive_label & is_positive_prediction))
    false_positives = int(np.sum(~is_positive_label & is_positive_prediction))
    false_negatives = int(np.sum(is_positive_label & ~is_positive_prediction))
    denominator = 2 * true_positives + false_positives + false_negatives
    return 2.0 * true_positives / denominator if denominator else 0.0


def matthews_corrcoef(labels, predictions):
    """Matthews correlation coefficient (GLUE CoLA), multi-class form of Gorodkin (2004).

    MCC = (c s - t.p) / sqrt((s^2 - p.p)(s^2 - t.t)) with c correct predictions, s
    samples, t and p the per-class counts of labels and predictions. 0.0 when undefined
    (a constant labelling or prediction), as scikit-learn returns.
    """
    labels, predictions = _paired(labels, predictions)
    classes = np.union1d(labels, predictions)
    label_counts = np.array([np.sum(labels == c) for c in classes], dtype=np.float64)
    prediction_counts = np.array([np.sum(predictions == c) for c in classes], dtype=np.float64)
    correct, samples = float(np.sum(labels == predictions)), float(len(labels))
    covariance = correct * samples - label_counts @ prediction_counts
    prediction_variance = samples**2 - prediction_counts @ prediction_counts
    label_variance = samples**2 - label_counts @ label_counts
    if prediction_variance * label_variance == 0:
        return 0.0
    return float(covariance / np.sqrt(prediction_variance * label_variance))


def pearson(x, y):
    """Pearson correlation (GLUE STS-B); NaN when either input is constant, as SciPy."""
    x, y = _paired(x, y, "x", "y")
    x_centred = x.astype(np.float64) - np.mean(x, dtype=np.float64)
    y_centred = y.astype(np.float64) - np.mean(y, dtype=np.float64)
    x_norm, y_norm = np.linalg.norm(x_centred), np.linalg.norm(y_centred)
    if x_norm == 0 or y_norm == 0:
        return float("nan")
    # Normalising before the dot product keeps rounding from pushing |r| past 1.
    return float(np.clip((x_centred / x_norm) @ (y_centred / y_norm), -1.0, 1.0))


def average_ranks(values):
    """1-based ranks of `values`; tied values share the mean of the ranks they span."""
    values = np.asarray(values)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    ranks = np.empty(len(values), dtype=np.float64)
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def spearman(x, y):
    """Spearman rank correlation (GLUE STS-B): Pearson of the average ranks, as SciPy."""
    x, y = _paired(x, y, "x", "y")
    return pearson(average_ranks(x), average_ranks(y))


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text):
    """SQuAD v1.1 normalisation: lower case, drop ASCII punctuation, drop the articles
    a/an/the as whole words, collapse whitespace."""
    text = "".join(character for character in text.lower() if character not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _best_over(score, prediction, ground_truths):
    ground_truths = list(ground_truths)
    if not ground_truths:
        raise ValueError("ground_truths must hold at least one answer. Received: []")
    return max(score(prediction, truth) for truth in ground_truths)


def _exact_match_one(prediction, ground_truth):
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def _f1_one(prediction, ground_truth):
    predicted_tokens = normalize_answer(prediction).split()
    true_tokens = normalize_answer(ground_truth).split()
    shared = sum((collections.Counter(predicted_tokens) & collections.Counter(true_tokens)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted_tokens), shared / len(true_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction, ground_truths):
    """1.0 if the normalised prediction equals any normalised ground truth, else 0.0."""
    return _best_over(_exact_match_one, prediction, ground_truths)


def f1_score(prediction, ground_truths):
    """Best token-level F1 (bag of normalised tokens) of `prediction` over `ground_truths`."""
    return _best_over(_f1_one, prediction, ground_truths)


def squad_scores(predictions, examples):
    """The official SQuAD v1.1 scores of `predictions` on `examples`.

    Args:
        predictions: dict question id -> predicted answer text. A question without a
            prediction scores 0; predictions for unknown ids are ignored.
        examples: iterable of objects with `id` and `answers` (a list of
            (text, char_start) pairs), e.g. `training.data.squad.SquadExample`.

    Returns:
        {"exact_match": percent, "f1": percent} over all examples.
    """
    exact_total, f1_total, count = 0.0, 0.0, 0
    for example in examples:
        count += 1
        if example.id not in predictions:
            continue
        truths = [text for text, _ in example.answers]
        exact_total += exact_match(predictions[example.id], truths)
        f1_total += f1_score(predictions[example.id], truths)
    if count == 0:
        raise ValueError("squad_scores needs at least one example. Received: no examples")
    return {"exact_match": 100.0 * exact_total / count, "f1": 100.0 * f1_total / count}
