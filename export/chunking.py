"""A served request in length-sorted chunks: bounded memory whatever the number of strings, and each
chunk padded only to its own longest text, so short texts cost little.

`chunked(texts, tokenizer, seq_length, run, names)` sorts a request's rows by their number of tokens (counted
a chunk at a time, `token_counts`: the request is tokenised twice, never whole), cuts the order into chunks of
at most `chunk_size` rows, none longer than `ratio` (1.5) times its chunk's first (`embeddings.batch_end`, the rule
`encode` batches by: the ratio adds at most one chunk per 1.5x of length a request spans), and inside a `tf.while_loop` that holds one chunk at a time (`parallel_iterations=1`)
tokenises the chunk, packs it to the smallest multiple of `bucket` that holds its
longest row (never beyond `seq_length`, where rows are truncated exactly as before; `bucket=1`, the default,
pads to the longest row itself, as sentence-transformers does) and runs the model on it; every output
row goes back to its place in the request. A request of one row (a text, or a pair) skips the counting, sorting and
loop: it is tokenised once and padded to its own length. Nothing is held for the whole request but its strings, the
order, the token counts and the outputs. Padding is masked, so the answers are those of
packing the whole request to `seq_length`, within float tolerance; the shapes the encoder sees are at
most `chunk_size` x one of `bucket_lengths`. Core TF ops only: stock TF Serving runs it (an export whose one-row
run XLA compiles, `concise-export --xla`, needs its --xla_cpu_compilation_enabled=true).

Why no coarser buckets: the serving graph takes any length without tracing again (its signature is
[None] strings, the encoder's shapes are dynamic), and time grows with the padded length: on all-MiniLM-L6-v2,
2-core CPU, a batch of 32 short texts (19 tokens) padded to 24 took 1.29x as long as at 19 (2026-11-25).
"""

import tensorflow as tf

from concise_attention.training.inference import embeddings

CHUNK_SIZE = 64  # rows a chunk holds: enough for efficient matrix products, small enough to bound memory
BUCKET = 1  # chunks are padded to a multiple of this many tokens: 1, to the chunk's longest text


def bucket_lengths(seq_length, bucket=BUCKET, shortest=2):
    """The padded lengths a chunk can have (`training.inference.embeddings.bucket_lengths`, shared with training)."""
    return embeddings.bucket_lengths(seq_length, bucket, shortest)


def _flat(segment):
    return segment.merge_dims(1, -1) if segment.ragged_rank > 1 else segment


def _traced(run, names):
    """`run` traced once on int32 [None, None] inputs named `names`, as a function of the packed inputs (all of them):
    every chunk and the one-row path call this one function, so a task model is not traced into the graph twice."""
    specs = {name: tf.TensorSpec([None, None], tf.int32) for name in names}
    traced = tf.function(run, autograph=False).get_concrete_function(specs)
    return _reading(traced, names), traced.structured_outputs


def _reading(function, names):
    """`function` of the packed inputs (all of them), given only those named `names`."""
    return lambda inputs: function({name: inputs[name] for name in names})


def _padded(tokens, bucket, seq_length):
    """The length a chunk whose longest row packs to `tokens` is padded to: the multiple of `bucket` at or above it,
    never beyond `seq_length`."""
    return tf.minimum((tokens + bucket - 1) // bucket * bucket, seq_length)


def _in_chunks(sorted_lengths, chunk_size, ratio, step, arrays):
    """`arrays` (TensorArrays) after `step(index, start, end, arrays)` for each chunk in turn, one at a time: the
    rows [start, end) that `embeddings.batch_end` gives, from the first row on."""

    def body(index, start, arrays):
        end = embeddings.batch_end(sorted_lengths, start, chunk_size, ratio)
        return index + 1, end, step(index, start, end, arrays)

    rows = tf.size(sorted_lengths)
    return tf.while_loop(
        lambda index, start, _: start < rows, body, (tf.constant(0), tf.constant(0), arrays), parallel_iterations=1
    )[2]


def text_input(name):
    """A served text input's spec: strings of any rank, so that `checked_texts` can check the rank when the graph runs.
    Declared [None], the rank is folded to 1 by graph optimisation (TensorFlow's, in a loaded SavedModel's signature
    call), and a bare string passed it unchecked to the tokenizer ("Attempting to slice scalar input")."""
    return tf.TensorSpec(None, tf.string, name=name)


def checked_texts(texts, names):
    """`texts` (string tensors, one per input named in `names`) behind run-time checks: each a list of strings (rank 1),
    a pair's two as long as each other; else one InvalidArgument naming the input; each then of static shape [None].
    TF Serving does not check a request against the signature's shapes: a scalar `text` had reached the tokenizer as
    "Attempting to slice scalar input". The inputs are of unknown rank (`text_input`): no check is folded away."""
    checks = []
    for name, text in zip(names, texts):
        rank = tf.raw_ops.Rank(input=text)
        checks.append(
            tf.debugging.Assert(
                tf.equal(rank, 1), [f"{name} must be a list of strings, one per row (rank 1); got rank", rank]
            )
        )
    checks += [
        tf.debugging.assert_equal(
            tf.size(text), tf.size(texts[0]), message=f"{names[0]} and {name} must hold as many strings"
        )
        for name, text in zip(names[1:], texts[1:])
    ]
    with tf.control_dependencies(checks):
        return [tf.reshape(tf.identity(text), [-1]) for text in texts]  # static shape [None], once checked


def _packed_lengths(segments):
    """int32 [rows]: each row's length once packed, before padding or cutting: its texts' WordPieces, [CLS] and one
    [SEP] per text."""
    return tf.add_n([tf.cast(segment.row_lengths(), tf.int32) for segment in segments]) + 1 + len(segments)


def token_counts(texts, tokenizer, seq_length, chunk_size=CHUNK_SIZE):
    """int32 [N]: each row's packed tokens (`_packed_lengths`; each text read to `seq_length` words at most), counted
    a chunk at a time in the request's order (the ids are not kept): the key the rows are sorted by, so that a
    chunk's rows have nearly the same number of tokens. Sorting by bytes, which costs no tokenisation, padded a
    chunk of 64 mixed sentences to 1.46-1.53x their real tokens (1.06-1.09x sorted by tokens; 2026-11-28)."""

    def step(index, start, end, arrays):
        segments = [_flat(tokenizer.tokenize(text[start:end], max_length=seq_length)) for text in texts]
        return [arrays[0].write(index, _packed_lengths(segments))]

    counts = tf.TensorArray(tf.int32, size=0, dynamic_size=True, infer_shape=False, element_shape=[None])
    return _in_chunks(tf.zeros_like(texts[0], tf.int32), chunk_size, None, step, [counts])[
        0
    ].concat()  # chunk_size at a time


def chunked(
    texts,
    tokenizer,
    seq_length,
    run,
    names,
    chunk_size=CHUNK_SIZE,
    bucket=BUCKET,
    ratio=embeddings.LENGTH_RATIO,
    text_names=("text", "text_b"),
    one_row=None,
):
    """Outputs of `run` for every row of `texts`, computed chunk by chunk.

    Args:
        texts: 1 or 2 string tensors [N] (named `text_names` in errors).
        tokenizer: a `training.preprocessing.text.WordPieceModule`, called on one chunk at a time.
        seq_length: the most a chunk is padded to.
        run: `inputs dict -> nest of tensors [n, ...]`, reading the inputs `names`.
        one_row: None, or (run, bucket) for a one-row request (an XLA-compiled run).
    Returns:
        `run`'s output structure, every tensor [N, ...] in the request's order.
    """
    texts = checked_texts(texts, text_names)
    call, structure = _traced(run, names)
    alone = (_reading(one_row[0], names), one_row[1]) if one_row else (call, bucket)
    results = tf.cond(
        tf.equal(tf.size(texts[0]), 1),
        lambda: _one_row(texts, tokenizer, seq_length, *alone, structure),
        lambda: _sorted_chunks(texts, tokenizer, seq_length, call, structure, chunk_size, bucket, ratio),
    )
    return tf.nest.pack_sequence_as(structure, results)


def _one_row(texts, tokenizer, seq_length, run, bucket, structure):
    """`run`'s flat outputs for a request of one row, tokenised once and padded to its own length (or the bucket
    above it): a single row needs no counting, sorting or loop (the export's batch-1 requests:
    `benchmarks/xla_serving.py`)."""
    segments = [_flat(tokenizer.tokenize(text, max_length=seq_length)) for text in texts]
    outputs = run(tokenizer.pack(segments, _padded(_packed_lengths(segments)[0], bucket, seq_length)))
    tf.nest.assert_same_structure(outputs, structure)  # a one_row run of its own gives what `run` gives
    return [tf.cast(output, spec.dtype) for output, spec in zip(tf.nest.flatten(outputs), tf.nest.flatten(structure))]


def _sorted_chunks(texts, tokenizer, seq_length, run, structure, chunk_size, bucket, ratio):
    """`run`'s flat outputs for every row of `texts`, in length-sorted chunks (the module docstring)."""
    counts = token_counts(texts, tokenizer, seq_length, chunk_size)
    order = tf.argsort(counts, stable=True)
    # chunks of at most chunk_size rows, none longer than `ratio` times the first (`embeddings.batch_end`, as `encode`
    # batches), lengths in packed tokens
    sorted_lengths = tf.minimum(tf.gather(counts, order), seq_length)
    specs = tf.nest.flatten(structure)
    arrays = [
        tf.TensorArray(spec.dtype, size=0, dynamic_size=True, infer_shape=False, element_shape=spec.shape)
        for spec in specs
    ]

    def step(index, start, end, arrays):
        chosen = order[start:end]
        segments = [_flat(tokenizer.tokenize(tf.gather(text, chosen), max_length=seq_length)) for text in texts]
        longest = sorted_lengths[end - 1]  # the chunk's last row, sorted: its longest (token_counts counted it)
        outputs = tf.nest.flatten(run(tokenizer.pack(segments, _padded(longest, bucket, seq_length))))
        return [array.write(index, tf.cast(output, spec.dtype)) for array, output, spec in zip(arrays, outputs, specs)]

    arrays = _in_chunks(sorted_lengths, chunk_size, ratio, step, arrays)
    inverse = tf.math.invert_permutation(order)
    return [tf.gather(array.concat(), inverse) for array in arrays]
