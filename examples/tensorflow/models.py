"""Small Keras 3 models for the TensorFlow examples (synthetic data, CPU-sized).

``build(name, batch_size)`` returns the model, a ``tf.data`` dataset of one synthetic
batch repeated forever (its ``IteratorGetNext`` op shows up as IO in the profile) and the
loss function.
"""

from __future__ import annotations

from typing import Callable

import keras
import tensorflow as tf

MODEL_NAMES = ("convnet", "transformer")
DEFAULT_BATCH_SIZE = {"convnet": 32, "transformer": 16}


def convnet() -> keras.Model:
    """A small VGG-style conv net on 32x32x3 images, 10 classes (~0.6 M parameters)."""
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
        keras.layers.MaxPooling2D(name="pool1"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu", name="conv3"),
        keras.layers.MaxPooling2D(name="pool2"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(128, activation="relu", name="fc1"),
        keras.layers.Dense(10, name="fc2"),
    ], name="convnet")


def transformer(vocab: int = 2000, seq: int = 64, dim: int = 64, heads: int = 4, blocks: int = 2) -> keras.Model:
    """A 2-block transformer encoder classifier over token ids (~0.3 M parameters)."""
    ids = keras.Input((seq,), dtype="int32")
    x = keras.layers.Embedding(vocab, dim, name="embed")(ids)
    pos = keras.layers.Embedding(seq, dim, name="pos")(keras.ops.arange(seq))
    x = x + pos
    for b in range(blocks):
        h = keras.layers.LayerNormalization(name=f"b{b}_ln1")(x)
        h = keras.layers.MultiHeadAttention(heads, dim // heads, name=f"b{b}_attn")(h, h)
        x = x + h
        h = keras.layers.LayerNormalization(name=f"b{b}_ln2")(x)
        h = keras.layers.Dense(4 * dim, activation="gelu", name=f"b{b}_ff1")(h)
        h = keras.layers.Dense(dim, name=f"b{b}_ff2")(h)
        x = x + h
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    out = keras.layers.Dense(10, name="head")(x)
    return keras.Model(ids, out, name="transformer")


def build(name: str, batch_size: int | None = None, seed: int = 0) -> tuple[keras.Model, tf.data.Dataset, Callable]:
    """(model, dataset of (x, y) batches, loss(y, logits))."""
    bs = batch_size or DEFAULT_BATCH_SIZE[name]
    g = tf.random.Generator.from_seed(seed)
    if name == "convnet":
        model = convnet()
        x = g.normal((bs, 32, 32, 3))
    elif name == "transformer":
        model = transformer()
        x = g.uniform((bs, 64), maxval=2000, dtype=tf.int32)
    else:
        raise ValueError(f"unknown model {name!r} (one of {MODEL_NAMES})")
    y = g.uniform((bs,), maxval=10, dtype=tf.int32)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()

    def loss(y_true: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True))

    return model, ds, loss
