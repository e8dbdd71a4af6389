"""A transformer text classifier on int token ids, after keras-io
examples/nlp/text_classification_with_transformer.py.

The example's pattern: a ``TransformerBlock`` layer (MultiHeadAttention, a two-Dense feed-forward net, two
LayerNormalizations with residuals, two Dropouts) and a ``TokenAndPositionEmbedding`` layer (token Embedding plus
a position Embedding over ``ops.arange``), then GlobalAveragePooling1D, Dropout, Dense(20, relu), Dropout and a
two-way softmax; int token-id sequences padded to ``maxlen``, ``sparse_categorical_crossentropy``, Adam, ``fit``
with ``validation_data``.

Data instead of the IMDB reviews (no downloads): seeded synthetic "reviews" of 32 token ids from a 500-word
vocabulary, where ids 2..41 are "positive" words and 42..81 "negative" ones; the label says which kind occurs
more often. 2000 train / 400 validation. Cuts: vocabulary 20000 -> 500, maxlen 200 -> 32, embedding 32 -> 16,
2 epochs -> 4.

Tolerance: the validation accuracy of the last epoch within 0.08 (it reaches ~0.9 here from 0.5 at chance);
another data order or a 2-replica run moves it a few hundredths, an untrained or half-trained port misses.
"""
import keras
import numpy as np
from keras import layers, ops

import corpus_report

keras.utils.set_random_seed(0)

TOLERANCE = {"key": "val_accuracy", "abs": 0.08}


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs, training=False):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


vocab_size = 500
maxlen = 32


def make_reviews(n, rng):
    tokens = rng.randint(82, vocab_size, size=(n, maxlen))
    positive = rng.randint(0, 6, size=n)
    negative = rng.randint(0, 6, size=n)
    for i in range(n):
        slots = rng.choice(maxlen, positive[i] + negative[i], replace=False)
        tokens[i, slots[:positive[i]]] = rng.randint(2, 42, size=positive[i])
        tokens[i, slots[positive[i]:]] = rng.randint(42, 82, size=negative[i])
    labels = (positive > negative).astype("int64")
    return tokens, labels


rng = np.random.RandomState(0)
x_train, y_train = make_reviews(2000, rng)
x_val, y_val = make_reviews(400, rng)
print(len(x_train), "Training sequences")
print(len(x_val), "Validation sequences")

embed_dim = 16
num_heads = 2
ff_dim = 16

inputs = layers.Input(shape=(maxlen,))
embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
x = embedding_layer(inputs)
transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim)
x = transformer_block(x)
x = layers.GlobalAveragePooling1D()(x)
x = layers.Dropout(0.1)(x)
x = layers.Dense(20, activation="relu")(x)
x = layers.Dropout(0.1)(x)
outputs = layers.Dense(2, activation="softmax")(x)

model = keras.Model(inputs=inputs, outputs=outputs)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x_train, y_train, batch_size=32, epochs=4, validation_data=(x_val, y_val))

probabilities = model.predict(x_val[:8], verbose=0)
corpus_report.report(history, model, {
    "predict_shape": probabilities.shape,
    "probabilities_sum_to_one": bool(np.allclose(probabilities.sum(axis=-1), 1.0, atol=1e-5)),
    "embedding_on_its_own_shape": embedding_layer(x_val[:2]).shape,
    "val_evaluate": model.evaluate(x_val, y_val, verbose=0, return_dict=True),
})
