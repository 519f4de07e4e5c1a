"""Talking-heads attention fused into Pallas kernels, for the JAX backend.

What `TalkingHeadsAttention` computes between its qkv projection and its output
projection, without writing any (batch, heads, tokens, tokens) tensor to memory.
With H heads of size d and N tokens, for each query row:

    A_h  = s · q_h k_hᵀ                  logits, s = d^-1/2 (the layer's scale)
    A'_g = Σ_h P_l[h, g] A_h             pre-softmax head mix (its bias b_l: see below)
    S_g  = softmax(A'_g)                 over the N keys, in float32
    S'_g = Σ_h P_w[h, g] S_h + b_w[g]    post-softmax head mix
    O_g  = S'_g v_g

P_l and P_w are the Keras kernels of the two mixes (input head × output head), b_w
the post-softmax bias. The pre-softmax bias b_l adds the same number to every logit
of a row, which the softmax takes away again: it is not an input here, and its
gradient is exactly zero (the layer keeps the weight, so its checkpoints and config
are unchanged). The backward pass, for the cotangent dO of O:

    dS'_g = dO_g v_gᵀ                dv_g = S'_gᵀ dO_g              db_w[g] = Σ dS'_g
    dP_w[h, g] = Σ S_h ⊙ dS'_g       dS_h = Σ_g P_w[h, g] dS'_g
    δ_g = rowsum(S_g ⊙ dS_g)         dA'_g = S_g ⊙ (dS_g − δ_g)     (softmax)
    dP_l[h, g] = Σ A_h ⊙ dA'_g       dA_h = Σ_g P_l[h, g] dA'_g
    dq_h = s · dA_h k_h              dk_h = s · dA_hᵀ q_h

Three kernels, each program one batch element and one tile:

- forward, over (batch, query tiles of T_q rows): all N keys of every head are on
  chip, so the softmax is exact in one pass (no online softmax). It writes O and
  the logsumexp L_g = log Σ_keys exp(A'_g) of each row;
- backward over queries, (batch, query tiles): recomputes S = exp(A' − L) for whole
  rows and writes dq, δ, and the tile's partial sums of dP_l, dP_w and db_w
  (H² + H² + H numbers per tile, summed over tiles by XLA afterwards);
- backward over keys, (batch, key tiles of T_k rows): loops over the query tiles,
  recomputes S for each (T_q, T_k) block from L, and accumulates dk and dv, as
  FlashAttention-2's backward does (dk, dv sum over every query: a kernel over
  query tiles would have to write a partial dk, dv per tile).

Where q, k, v lie: the kernels read them from the layer's qkv projection, `(batch, N, 3C)`
viewed as `(batch, N, 3, H, d)` (a reshape, no copy), and write O as `(batch, N, H, d)`, which
the output projection reads as it is. The backward pass writes dq, dk and dv into one tensor of
the qkv's shape, the projection's gradient: the query kernel writes dq into it and the key
kernel, given that tensor as its own output (aliased), adds dk and dv. No pad, transpose, slice
or concatenate copies anything between the two projections (`tests/kernels/`).

Stored for the backward pass: the qkv tensor (the layer's, kept anyway) and the logsumexp L,
(batch, heads, N_t) float32 with N_t the rows of the query tiles; δ, of L's size, lives only
during the backward pass. At CaiT-S24's self-attention, batch 128, `mixed_bfloat16`, the layer
keeps 93.8 MiB for its backward pass (L: 0.8 MiB) where the keras.ops path keeps 469.7 MiB,
mostly the (batch, heads, N, N) softmax in float32 and the logits, probabilities and mixed
weights in bfloat16 (`python -m benchmarks.talking_heads_kernel --residuals-only`).

Tiles and padding, on chip only: Triton's blocks are powers of two, so a tile of keys spans
N_p, the next power of two of at least 16 (196 and 197 → 256), and a tile's channels d_p
(48 → 64). Loads are masked: rows past the N tokens and channels past the head size d read
as zeros, and stores write only what lies inside. Padded keys are masked out of the softmax;
a padded query row (the last tile's, past N) reads zero q and dO and adds nothing.
T_q = T_k = 16, the smallest side of a Triton dot, and ⌈N/16⌉ tiles cover the tokens (13 for
197). A forward program holds the logits and then S of every head, up to 2H + 1 float32
(T_q, N_p) tiles; the query backward keeps S, dS' and dA' (about 2H + 1 tiles) and computes
each head's logits again where dP_l needs them rather than keeping them from the start (4H
tiles). Each head's q and k tiles are loaded right before its dot, so that one head's keys at
a time sit in shared memory. Compiled by XLA:GPU for an H100 (`python -m benchmarks.gpu_compile`,
no GPU needed), at S24's shape every kernel fits the chip's shared memory and uses 255
registers a thread, spilling 0.6 KB (forward), 2.5 KB (query backward) and 0.1 KB (key
backward) a thread; at XXS24's (4 heads), 8 bytes (query backward). The dot inputs keep the
layer's compute dtype (bfloat16 under `mixed_bfloat16`) with float32 accumulation; the mixes
and the softmax are float32.

On a GPU the kernels are compiled by Triton (`compiler_params` picks it); elsewhere
they run in Pallas' interpreter (`interpret=True`), as the tests do on the CPU:
exact, but far slower than the keras.ops path.

Example:
    q = k = v = jnp.ones((2, 197, 8, 48), jnp.bfloat16)
    mix = jnp.eye(8)
    talking_heads_attention(q, k, v, mix, mix, jnp.zeros(8), scale=48**-0.5).shape
    # (2, 197, 8, 48)
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

BLOCK_QUERIES = 16
BLOCK_KEYS = 16
MIN_SIDE = 16  # the smallest side of a Triton dot
NUM_WARPS = 8  # 255 registers a thread; 16 warps (128 registers) spilled more at S24 (benchmarks/gpu_compile.py)
# The most heads × N_p a program's tiles may span. A forward program keeps 2H + 1 float32 tiles of
# (T_q, N_p) live, the query backward about as many: at CaiT-S24's 224-pixel shape (8 heads, 256)
# they spill 0.6 and 2.5 KB a thread (compiled for an H100, `benchmarks/gpu_compile.py`); at
# 384 pixels (8 heads over 577 tokens: 1024) 60 and 160 KB, local memory traffic no kernel recovers.
MAX_HEADS_TIMES_KEYS = 8 * 256


def on_gpu():
    """Whether JAX's default device is a GPU, where the kernels compile (elsewhere they interpret)."""
    return jax.default_backend() == "gpu"


def fits_on_chip(tokens, heads):
    """Whether the kernels' tiles for `heads` heads over `tokens` tokens stay in a program's registers
    (`MAX_HEADS_TIMES_KEYS`): CaiT's 224-pixel models do, its 384- and 448-pixel ones do not."""
    return heads * _padded(tokens) <= MAX_HEADS_TIMES_KEYS


def talking_heads_attention(query, key, value, pre_softmax_mix, post_softmax_mix, post_softmax_bias, *,
                            scale, interpret=None):
    """`O_g = (Σ_h P_w[h, g] softmax(Σ_h P_l[h, g] s·q_h k_hᵀ) + b_w[g]) v_g`, differentiable.

    Args:
        query, key, value: `(batch, tokens, heads, head_dim)`, one dtype.
        pre_softmax_mix, post_softmax_mix: `(heads, heads)` kernels P_l, P_w, input head × output head.
        post_softmax_bias: `(heads,)`, b_w.
        scale: the logits' scale s (the layer's `head_dim ** -0.5`).
        interpret: run in Pallas' interpreter; None: unless JAX's default device is a GPU.

    Returns:
        `(batch, tokens, heads, head_dim)` in the dtype of `query`.
    """
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(f"query, key, value of dtypes {query.dtype}, {key.dtype}, {value.dtype}: give one dtype.")
    return talking_heads_attention_qkv(jnp.stack([query, key, value], axis=2), pre_softmax_mix, post_softmax_mix,
                                       post_softmax_bias, scale=scale, interpret=interpret)


def talking_heads_attention_qkv(qkv, pre_softmax_mix, post_softmax_mix, post_softmax_bias, *, scale,
                                interpret=None):
    """`talking_heads_attention` on q, k, v as one `(batch, tokens, 3, heads, head_dim)` tensor.

    This is the layer's qkv projection `(batch, tokens, 3 · heads · head_dim)` reshaped, which
    costs no copy: the kernels read q, k and v from it where they lie, and the backward pass
    writes dq, dk and dv into one such tensor, the projection's gradient.
    """
    return _attention(
        qkv, jnp.asarray(pre_softmax_mix, jnp.float32), jnp.asarray(post_softmax_mix, jnp.float32),
        jnp.asarray(post_softmax_bias, jnp.float32),
        float(scale), not on_gpu() if interpret is None else bool(interpret),
    )


QUERY, KEY, VALUE = 0, 1, 2  # the parts of the qkv tensor's third axis


def _padded(size):
    return max(MIN_SIDE, pl.next_power_of_2(size))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention(qkv, pre, post, bias, scale, interpret):
    return _forward(qkv, pre, post, bias, scale, interpret)[0]


def _attention_forward(qkv, pre, post, bias, scale, interpret):
    outputs, logsumexp = _forward(qkv, pre, post, bias, scale, interpret)
    return outputs, (qkv, pre, post, bias, logsumexp)


def _attention_backward(scale, interpret, residuals, d_outputs):
    qkv, pre, post, bias, logsumexp = residuals
    d_qkv, delta, d_pre, d_post, d_bias = _backward_queries(qkv, d_outputs, logsumexp, pre, post, scale, interpret)
    # dk and dv go into the same tensor as dq: the key kernel's output is the query kernel's.
    d_qkv = _backward_keys(qkv, d_outputs, logsumexp, delta, pre, post, bias, d_qkv, scale, interpret)
    return d_qkv, d_pre.sum((0, 1)), d_post.sum((0, 1)), d_bias.sum((0, 1))


_attention.defvjp(_attention_forward, _attention_backward)


# === Pieces of the kernels (on tiles; `mix[h][g]` are scalars read from a kernel's ref) ===

def _where(ref, start, size, index):
    """The index of rows [start, start + size) of `ref[:, *index, :]`, all channels padded to d_p,
    and the mask of what lies inside the tensor (rows below N, channels below d)."""
    tokens, dim = ref.shape[0], ref.shape[-1]
    padded_dim = _padded(dim)
    rows = start + lax.broadcasted_iota(jnp.int32, (size, padded_dim), 0)
    channels = lax.broadcasted_iota(jnp.int32, (size, padded_dim), 1)
    at = ref.at[(pl.ds(start, size), *(jnp.int32(i) for i in index), pl.ds(0, padded_dim))]
    return at, (rows < tokens) & (channels < dim)


def _load(ref, start, size, *index):
    """A (size, d_p) tile of `ref[start:start + size, *index, :]`; what lies past the N tokens or the d
    channels reads as zero."""
    at, inside = _where(ref, start, size, index)
    return pltriton.load(at, mask=inside, other=jnp.zeros((), ref.dtype))


def _store(ref, start, tile, *index):
    """Writes the inside of a (size, d_p) tile to `ref[start:start + size, *index, :]`."""
    at, inside = _where(ref, start, tile.shape[0], index)
    pltriton.store(at, tile.astype(ref.dtype), mask=inside)


def _scalars(ref, heads):
    return [[ref[h, g] for g in range(heads)] for h in range(heads)]


def _dot(a, b):  # a b
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_bt(a, b):  # a bᵀ
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_at(a, b):  # aᵀ b
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _mix(tiles, mix, g):
    """Σ_h mix[h][g] · tiles[h]: output head g of a head mix."""
    mixed = tiles[0] * mix[0][g]
    for h in range(1, len(tiles)):
        mixed = mixed + tiles[h] * mix[h][g]
    return mixed


def _logits(query_of, key_of, heads, scale):
    """A_h = s · q_h k_hᵀ for every head, float32. Each head's tiles are loaded right before its dot
    (`query_of(h)`, `key_of(h)`): loaded all at once, the keys of every head would be live in shared
    memory together, 8 × 32 KB at S24, more than an H100's 227 KB."""
    return [_dot_bt(query_of(h), key_of(h)) * scale for h in range(heads)]


def _tile_start(block):
    return pl.multiple_of(pl.program_id(1) * block, block)


# === Forward ===

def _forward_kernel(qkv_ref, pre_ref, post_ref, bias_ref, out_ref, lse_ref, *, scale):
    tokens, _, heads, _ = qkv_ref.shape
    padded, block = _padded(tokens), lse_ref.shape[-1]
    start = _tile_start(block)
    pre, post = _scalars(pre_ref, heads), _scalars(post_ref, heads)
    logits = _logits(lambda h: _load(qkv_ref, start, block, QUERY, h), lambda h: _load(qkv_ref, 0, padded, KEY, h),
                     heads, scale)
    keys = lax.broadcasted_iota(jnp.int32, logits[0].shape, 1) < tokens  # padded keys leave the softmax
    probabilities = []
    for g in range(heads):
        mixed = jnp.where(keys, _mix(logits, pre, g), -jnp.inf)
        top = jnp.max(mixed, axis=1)
        exponentials = jnp.exp(mixed - top[:, None])
        total = jnp.sum(exponentials, axis=1)
        probabilities.append(exponentials / total[:, None])
        lse_ref[g, :] = top + jnp.log(total)
    for g in range(heads):
        # A padded key's weight is b_w[g], not zero: its row of v, read as zeros, takes it away.
        weights = _mix(probabilities, post, g) + bias_ref[g]
        _store(out_ref, start, _dot(weights.astype(qkv_ref.dtype), _load(qkv_ref, 0, padded, VALUE, g)), g)


def _specs(heads, block, tokens, dim, rows):
    """BlockSpecs on a (batch, tiles) grid: a batch element's whole qkv, outputs (or their gradient),
    a tile of row statistics (logsumexp, δ) or all of them, the mixes, per-tile partial sums."""
    return dict(
        qkv=pl.BlockSpec((None, tokens, 3, heads, dim), lambda b, i: (b, 0, 0, 0, 0)),
        outputs=pl.BlockSpec((None, tokens, heads, dim), lambda b, i: (b, 0, 0, 0)),
        row_stats=pl.BlockSpec((None, heads, block), lambda b, i: (b, 0, i)),
        all_row_stats=pl.BlockSpec((None, heads, rows), lambda b, i: (b, 0, 0)),
        mix=pl.BlockSpec((heads, heads), lambda b, i: (0, 0)),
        bias=pl.BlockSpec((heads,), lambda b, i: (0,)),
        tile_mix=pl.BlockSpec((None, None, heads, heads), lambda b, i: (b, i, 0, 0)),
        tile_bias=pl.BlockSpec((None, None, heads), lambda b, i: (b, i, 0)),
    )


def _geometry(qkv):
    """(batch, tokens, heads, dim, block, tiles): T_q = T_k, and the tiles that cover the N tokens."""
    batch, tokens, _, heads, dim = qkv.shape
    block = min(BLOCK_QUERIES, _padded(tokens))
    return batch, tokens, heads, dim, block, pl.cdiv(tokens, block)


def _call(kernel, grid, in_specs, out_specs, out_shape, interpret, name, **kwargs):
    return pl.pallas_call(
        kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS), interpret=interpret, name=name, **kwargs,
    )


def _forward(qkv, pre, post, bias, scale, interpret):
    batch, tokens, heads, dim, block, tiles = _geometry(qkv)
    spec = _specs(heads, block, tokens, dim, tiles * block)
    call = _call(
        functools.partial(_forward_kernel, scale=scale),
        (batch, tiles),
        [spec["qkv"], spec["mix"], spec["mix"], spec["bias"]],
        [spec["outputs"], spec["row_stats"]],
        [jax.ShapeDtypeStruct((batch, tokens, heads, dim), qkv.dtype),
         jax.ShapeDtypeStruct((batch, heads, tiles * block), jnp.float32)],
        interpret, "talking_heads_attention_forward",
    )
    return call(qkv, pre, post, bias)


# === Backward over query tiles: dq, δ and the mixes' gradients ===

def _backward_queries_kernel(qkv_ref, dout_ref, lse_ref, pre_ref, post_ref,
                             dqkv_ref, delta_ref, dpre_ref, dpost_ref, dbias_ref, *, scale):
    tokens, _, heads, _ = qkv_ref.shape
    padded, block = _padded(tokens), lse_ref.shape[-1]
    start = _tile_start(block)
    pre, post = _scalars(pre_ref, heads), _scalars(post_ref, heads)

    def query(h):
        return _load(qkv_ref, start, block, QUERY, h)

    def key(h):
        return _load(qkv_ref, 0, padded, KEY, h)

    logits = _logits(query, key, heads, scale)
    # Not masked: a padded key's (wrong) probabilities only ever meet zeros, its dS' (its row of v
    # reads as zeros), its logits and its row of k, so nothing of them reaches dq or the mixes.
    probabilities = [jnp.exp(_mix(logits, pre, g) - lse_ref[g][:, None]) for g in range(heads)]
    d_weights = [_dot_bt(_load(dout_ref, start, block, g), _load(qkv_ref, 0, padded, VALUE, g))
                 for g in range(heads)]  # dS'_g
    for g in range(heads):
        dbias_ref[g] = jnp.sum(d_weights[g])
        for h in range(heads):
            dpost_ref[h, g] = jnp.sum(probabilities[h] * d_weights[g])
    transposed_post = [[post[g][h] for g in range(heads)] for h in range(heads)]
    d_logits = []  # dA'_g
    for g in range(heads):
        d_probabilities = _mix(d_weights, transposed_post, g)  # dS_g = Σ_g' P_w[g, g'] dS'_g'
        delta = jnp.sum(probabilities[g] * d_probabilities, axis=1)
        delta_ref[g, :] = delta
        d_logits.append(probabilities[g] * (d_probabilities - delta[:, None]))
    transposed_pre = [[pre[g][h] for g in range(heads)] for h in range(heads)]
    for h in range(heads):
        # A_h again, one head at a time: kept from the top, the logits of every head would stay
        # live beside the probabilities, dS' and dA' (4H tiles: registers spill, see the docstring).
        logit = _dot_bt(query(h), key(h)) * scale
        for g in range(heads):
            dpre_ref[h, g] = jnp.sum(logit * d_logits[g])
        d_logit = _mix(d_logits, transposed_pre, h)  # dA_h = Σ_g P_l[h, g] dA'_g
        _store(dqkv_ref, start, _dot(d_logit.astype(qkv_ref.dtype), key(h)) * scale, QUERY, h)  # k_h again


def _backward_queries(qkv, d_outputs, logsumexp, pre, post, scale, interpret):
    batch, tokens, heads, dim, block, tiles = _geometry(qkv)
    spec = _specs(heads, block, tokens, dim, tiles * block)
    call = _call(
        functools.partial(_backward_queries_kernel, scale=scale),
        (batch, tiles),
        [spec["qkv"], spec["outputs"], spec["row_stats"], spec["mix"], spec["mix"]],
        [spec["qkv"], spec["row_stats"], spec["tile_mix"], spec["tile_mix"], spec["tile_bias"]],
        [
            jax.ShapeDtypeStruct(qkv.shape, qkv.dtype),  # dq here; dk and dv from the key kernel
            jax.ShapeDtypeStruct((batch, heads, tiles * block), jnp.float32),
            jax.ShapeDtypeStruct((batch, tiles, heads, heads), jnp.float32),
            jax.ShapeDtypeStruct((batch, tiles, heads, heads), jnp.float32),
            jax.ShapeDtypeStruct((batch, tiles, heads), jnp.float32),
        ],
        interpret, "talking_heads_attention_backward_queries",
    )
    return call(qkv, d_outputs.astype(qkv.dtype), logsumexp, pre, post)


# === Backward over key tiles: dk, dv ===

def _backward_keys_kernel(qkv_ref, dout_ref, lse_ref, delta_ref, pre_ref, post_ref, bias_ref, _, dqkv_ref, *,
                          scale, block_queries, block_keys):
    heads = qkv_ref.shape[2]
    start = _tile_start(block_keys)
    pre, post = _scalars(pre_ref, heads), _scalars(post_ref, heads)
    transposed_post = [[post[g][h] for g in range(heads)] for h in range(heads)]
    transposed_pre = [[pre[g][h] for g in range(heads)] for h in range(heads)]
    key_tiles = [_load(qkv_ref, start, block_keys, KEY, h) for h in range(heads)]
    value_tiles = [_load(qkv_ref, start, block_keys, VALUE, h) for h in range(heads)]
    dim = key_tiles[0].shape[1]

    def query_tile(i, gradients):
        d_keys, d_values = list(gradients[0]), list(gradients[1])
        first = pl.multiple_of(i * block_queries, block_queries)
        rows = pl.ds(first, block_queries)
        query_tiles = [_load(qkv_ref, first, block_queries, QUERY, h) for h in range(heads)]
        logits = _logits(query_tiles.__getitem__, key_tiles.__getitem__, heads, scale)
        # Not masked: a padded key's (wrong) probabilities reach only its own rows of dk and dv,
        # which are not written. A padded query's q and dO read as zeros: it adds nothing.
        probabilities = [jnp.exp(_mix(logits, pre, g) - lse_ref[g, rows][:, None]) for g in range(heads)]
        d_weights = []
        for g in range(heads):
            d_out = _load(dout_ref, first, block_queries, g)
            weights = _mix(probabilities, post, g) + bias_ref[g]
            d_values[g] = d_values[g] + _dot_at(weights.astype(d_out.dtype), d_out)
            d_weights.append(_dot_bt(d_out, value_tiles[g]))
        d_logits = [
            probabilities[g] * (_mix(d_weights, transposed_post, g) - delta_ref[g, rows][:, None])
            for g in range(heads)
        ]
        for h in range(heads):
            d_logit = _mix(d_logits, transposed_pre, h)
            d_keys[h] = d_keys[h] + _dot_at(d_logit.astype(qkv_ref.dtype), query_tiles[h]) * scale
        return tuple(d_keys), tuple(d_values)

    zeros = tuple(jnp.zeros((block_keys, dim), jnp.float32) for _ in range(heads))
    d_keys, d_values = lax.fori_loop(0, lse_ref.shape[-1] // block_queries, query_tile, (zeros, zeros))
    for h in range(heads):
        _store(dqkv_ref, start, d_keys[h], KEY, h)
        _store(dqkv_ref, start, d_values[h], VALUE, h)


def _backward_keys(qkv, d_outputs, logsumexp, delta, pre, post, bias, d_qkv, scale, interpret):
    batch, tokens, heads, dim, block, tiles = _geometry(qkv)
    block_keys = min(BLOCK_KEYS, _padded(tokens))
    spec = _specs(heads, block, tokens, dim, tiles * block)
    call = _call(
        functools.partial(_backward_keys_kernel, scale=scale, block_queries=block, block_keys=block_keys),
        (batch, pl.cdiv(tokens, block_keys)),
        [spec["qkv"], spec["outputs"], spec["all_row_stats"], spec["all_row_stats"], spec["mix"], spec["mix"],
         spec["bias"], spec["qkv"]],
        spec["qkv"],
        jax.ShapeDtypeStruct(qkv.shape, qkv.dtype),
        interpret, "talking_heads_attention_backward_keys",
        input_output_aliases={7: 0},  # d_qkv, holding dq: this kernel adds dk and dv
    )
    return call(qkv, d_outputs.astype(qkv.dtype), logsumexp, delta, pre, post, bias, d_qkv)
