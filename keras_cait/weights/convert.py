"""Reading timm/DeiT checkpoints and mapping their keys onto a keras_cait model.

The key map below is the whole conversion: each timm key, the Keras weight it
becomes, and how it is reshaped. timm's names are the checkpoint contract; where
ours differ (`proj_l` → `pre_softmax_head_mix`, `gamma_1` → `attention_layer_scale`,
...) this is the one place that says so.
"""

import collections.abc
import os
import pickle

import numpy as np

from keras_cait.errors import ArgumentError, checked_bool, listed, quietly_caused
from keras_cait.layers.position_embedding import resize_position_embedding, source_grid_of


def _linear(x):  # torch Linear weight (out, in) -> Keras Dense kernel (in, out)
    return x.T


def _conv(x):  # torch Conv2d weight (out, in, kh, kw) -> Keras Conv2D kernel (kh, kw, in, out)
    return x.transpose(2, 3, 1, 0)


def _dense(prefix, layer):
    yield f"{prefix}.weight", layer.kernel, _linear
    yield f"{prefix}.bias", layer.bias, None


def _norm(prefix, layer):
    yield f"{prefix}.weight", layer.gamma, None
    yield f"{prefix}.bias", layer.beta, None


def _block(prefix, block, attention_projections):
    yield from _norm(f"{prefix}.norm1", block.attention_norm)
    for timm_name, keras_layer in attention_projections:
        yield from _dense(f"{prefix}.attn.{timm_name}", keras_layer)
    yield from _dense(f"{prefix}.attn.proj", block.attention.output_projection)
    yield f"{prefix}.gamma_1", block.attention_layer_scale.gamma, None
    yield from _norm(f"{prefix}.norm2", block.mlp_norm)
    yield from _dense(f"{prefix}.mlp.fc1", block.mlp_dense_1)
    yield from _dense(f"{prefix}.mlp.fc2", block.mlp_dense_2)
    yield f"{prefix}.gamma_2", block.mlp_layer_scale.gamma, None


def _layers_named(model, prefix):
    return sorted(
        (layer for layer in model.layers if layer.name.startswith(prefix)),
        key=lambda layer: int(layer.name.rsplit("_", 1)[1]),
    )


def timm_key_map(model, head=None):
    """Yields `(timm key, Keras variable, transform)` for every weight of `model`.

    `transform` turns the timm array into the Keras layout (None: as it is).
    The head (`head.*`) is listed only when the model has one (its `predictions`
    layer), or `head` is given: a Dense layer kept outside the model, as
    keras-hub's classifier keeps it beside its backbone.
    """
    yield "patch_embed.proj.weight", model.get_layer("patch_embedding").projection.kernel, _conv
    yield "patch_embed.proj.bias", model.get_layer("patch_embedding").projection.bias, None
    yield "pos_embed", model.get_layer("position_embedding").embeddings, None
    yield "cls_token", model.get_layer("class_token").token, None
    for i, block in enumerate(_layers_named(model, "self_attention_block_")):
        attention = block.attention
        yield from _block(f"blocks.{i}", block, [
            ("qkv", attention.qkv),
            ("proj_l", attention.pre_softmax_head_mix),
            ("proj_w", attention.post_softmax_head_mix),
        ])
    for i, block in enumerate(_layers_named(model, "class_attention_block_")):
        attention = block.attention
        yield from _block(f"blocks_token_only.{i}", block, [
            ("q", attention.query),
            ("k", attention.key),
            ("v", attention.value),
        ])
    yield from _norm("norm", model.get_layer("final_norm"))
    if head is None:
        head = next((layer for layer in model.layers if layer.name == "predictions"), None)
    if head is not None:
        yield from _dense("head", head)


def _describe(keys):
    return listed(sorted(keys), 8)


def nonfinite_error(names, source):
    """The refusal of weights holding NaN or inf in the tensors `names`."""
    return ValueError(
        f"The {source} holds NaN or inf in {len(names)} tensor(s): {_describe(names)}. "
        "Every prediction would be NaN; the file is damaged or from a diverged training run. "
        "Pass another file, or load it anyway with "
        "keras_cait.weights.load_weights_file(model, path, allow_nonfinite=True)."
    )


def load_state_dict(model, state_dict, source="checkpoint", allow_nonfinite=False, source_grid=None, head=None):
    """Assigns a timm-named state_dict (name -> numpy array) to `model` (and `head`, as
    `timm_key_map` takes it), strictly.

    Every key of the map must be present with the right shape, and no other key
    may be present (the head's keys are allowed when the model has no head).
    A position embedding of another grid is resized bicubically from
    `source_grid`, its `(rows, cols)`; timm's `pos_embed` does not record its
    grid, so without `source_grid` it is taken to be square, as in every
    released checkpoint (`checkpoint_grid` reads a grid stated in the file).
    Tensors holding NaN or inf are refused unless `allow_nonfinite`.

    Raises:
        ValueError: naming the missing, unexpected, wrongly shaped or
            non-finite keys.
    """
    from keras_cait.models.surgery import check_model_object  # here: keras_cait.models imports this module

    check_model_object(model, "load_state_dict")
    allow_nonfinite = checked_bool("allow_nonfinite", allow_nonfinite,
                                   "True (load NaN or inf as they are) or False (refuse them)")
    if isinstance(state_dict, (str, os.PathLike)):
        path = os.fspath(state_dict)
        raise ArgumentError("state_dict", path, "a path, not a state_dict (a dict of timm names to arrays)",
                            ["read it first: keras_cait.weights.read_checkpoint(", repr(path), "), or load the file "
                             "with keras_cait.weights.load_weights_file(model, ", repr(path), ")"], usage=True)
    if not isinstance(state_dict, collections.abc.Mapping):
        raise ArgumentError("state_dict", state_dict, f"must be a dict of timm names to arrays, not a "
                            f"{type(state_dict).__name__}",
                            "e.g. keras_cait.weights.read_checkpoint('model.safetensors')", usage=True,
                            shown=f"<{type(state_dict).__name__}>")
    source_grid = checked_source_grid(source_grid)
    key_map = list(timm_key_map(model, head))
    expected = {key for key, _, _ in key_map}
    missing = expected - set(state_dict)
    has_head = "head.weight" in expected
    unexpected = {
        key for key in set(state_dict) - expected if has_head or not key.startswith("head.")
    }
    values, wrong_shapes = {}, []
    for key, variable, transform in key_map:
        if key not in state_dict:
            continue
        value = np.asarray(state_dict[key], dtype="float32")
        value = transform(value) if transform else value
        if key == "pos_embed" and value.ndim == 3 and value.shape[2] == variable.shape[2]:
            value = _fit_position_embedding(value, model, source_grid)
        if value.shape != tuple(variable.shape):
            wrong_shapes.append(f"{key} {tuple(np.shape(state_dict[key]))}")
            continue
        values[key] = (variable, value)
    if has_head and missing == {"head.weight", "head.bias"} and not unexpected and not wrong_shapes:
        # A backbone's checkpoint: "another CaiT variant?" was no help.
        raise ValueError(f"The {source} holds no head (head.weight, head.bias), and the model '{model.name}' has "
                         "one: give include_top=False for its features, or classes=N for a new head of N classes.")
    if missing or unexpected or wrong_shapes:
        problems = []
        if missing:
            problems.append(f"missing keys: {_describe(missing)}")
        if unexpected:
            problems.append(f"unexpected keys: {_describe(unexpected)}")
        if wrong_shapes:
            problems.append(f"keys whose shape does not fit: {_describe(wrong_shapes)}")
        raise ValueError(
            f"The {source} does not fit the model '{model.name}' "
            f"({len(_layers_named(model, 'self_attention_block_'))} blocks, width "
            f"{model.get_layer('final_norm').gamma.shape[0]}): " + "; ".join(problems)
            + ". Is it a checkpoint of another CaiT variant?"
        )
    nonfinite = [key for key, (_, value) in values.items() if not np.isfinite(value).all()]
    if nonfinite and not allow_nonfinite:
        raise nonfinite_error(nonfinite, source)
    for variable, value in values.values():
        variable.assign(value)


def checked_source_grid(source_grid):
    """`source_grid` as `(rows, cols)` of positive ints, or None; else an `ArgumentError`."""
    if source_grid is None:
        return None
    try:
        rows, cols = source_grid
        fits = all(isinstance(side, (int, np.integer)) and not isinstance(side, bool) and side > 0
                   for side in (rows, cols))
    except (TypeError, ValueError):
        fits = False
    if not fits:
        raise ArgumentError("source_grid", source_grid,
                            "must be the (rows, cols) patch grid of the checkpoint's position embedding, "
                            "two positive ints",
                            "e.g. source_grid=(14, 14) for 196 positions, or None for a square grid", usage=True)
    return int(rows), int(cols)


def _fit_position_embedding(value, model, source_grid):
    grid_size = model.get_layer("position_embedding").grid_size
    if source_grid is None and value.shape[1] == grid_size[0] * grid_size[1]:
        return value  # no grid stated and the table fits: as it is
    source_grid = source_grid_of(value, source_grid)
    if source_grid == grid_size:
        return value
    return resize_position_embedding(value, grid_size, source_grid)


def checkpoint_grid(path):
    """The patch grid `(rows, cols)` a checkpoint states for its `pos_embed`, or None.

    A `.safetensors` file states it in its metadata as `grid_size` = `"rows,cols"`
    (`safetensors.torch.save_file(..., metadata={"grid_size": "9,16"})`); timm
    and DeiT's own files state none.
    """
    path = str(path)
    if not path.endswith(".safetensors"):
        return None
    from safetensors import safe_open

    try:
        with safe_open(path, framework="numpy") as file:
            stated = (file.metadata() or {}).get("grid_size")
            positions = file.get_slice("pos_embed").get_shape()[1] if "pos_embed" in file.keys() else None
    except Exception as error:  # safetensors' own error type is not public
        raise quietly_caused(unreadable(path, "safetensors", error), error) from None
    if stated is None:
        return None
    try:
        rows, cols = (int(side) for side in stated.split(","))
    except ValueError:
        rows = cols = 0
    # The file's own grid, checked here: a wrong one was refused as `source_grid`, which no caller gave.
    if rows < 1 or cols < 1:
        raise ValueError(f"{path}: metadata grid_size={stated!r} is not 'rows,cols' of two positive sides, "
                         "e.g. '14,14'.")
    if positions is not None and rows * cols != positions:
        raise ValueError(f"{path}: metadata grid_size={stated!r} states {rows * cols} positions, but its pos_embed "
                         f"holds {positions}; save the weights again from the model they belong to.")
    return rows, cols


def unreadable(path, kind, error):
    size = os.path.getsize(path)
    return ValueError(
        f"{path} ({size} bytes) is not a readable {kind} checkpoint: {error}. The file is "
        "truncated, empty or of another format; download it again (an interrupted copy?) "
        "or pass the right file."
    )


def _outline(checkpoint, tensor_type):
    """What a checkpoint that is not a state_dict holds, in a few words."""
    if not isinstance(checkpoint, dict):
        return f"a {type(checkpoint).__name__}"
    odd = next(
        (key, value) for key, value in checkpoint.items()
        if not isinstance(key, str) or not isinstance(value, tensor_type)
    )
    return f"a dict whose entry {odd[0]!r} is a {type(odd[1]).__name__}"


def read_checkpoint(path):
    """Reads a timm/DeiT checkpoint into {timm key: numpy array}.

    `.safetensors` is read with numpy alone. `.pth`/`.pt` needs PyTorch and is
    read with `torch.load(weights_only=True)`, which refuses pickled code; the
    official files' `{"model": ...}` wrapper and `module.` prefixes are removed.
    """
    path = str(path)
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file

        try:
            return load_file(path)
        except FileNotFoundError:
            raise
        except Exception as error:  # safetensors' own error type is not public
            raise quietly_caused(unreadable(path, "safetensors", error), error) from None
    if path.endswith((".pth", ".pt")):
        try:
            import torch
        except ImportError as error:
            raise ImportError(
                f"Reading {path} needs PyTorch: pip install 'keras-cait[torch]', or convert "
                "the file to .safetensors elsewhere."
            ) from error
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise
        except pickle.UnpicklingError as error:  # torch's advice (weights_only=False) would run it
            if "Unsupported global" not in str(error):  # random bytes, a damaged pickle: no code named
                raise unreadable(path, "PyTorch", "its pickle does not parse") from error
            raise ValueError(
                f"{path} holds objects other than tensors and numbers (pickled code?), so it "
                "was not loaded: keras_cait reads .pth files with torch.load(weights_only=True), "
                "which runs no code. Use the official checkpoint, or a .safetensors file."
            ) from error
        except Exception as error:  # truncated, or no torch file at all (text: KeyError, UnicodeDecodeError)
            said = " ".join(str(error).split())[:80]
            raise unreadable(path, "PyTorch", f"torch.load failed with {type(error).__name__}: {said}") from error
        if isinstance(checkpoint, dict) and "model" in checkpoint:
            checkpoint = checkpoint["model"]
        if not isinstance(checkpoint, dict) or not all(
            isinstance(key, str) and isinstance(value, torch.Tensor)
            for key, value in checkpoint.items()
        ):
            raise ValueError(
                f"{path} holds {_outline(checkpoint, torch.Tensor)}, not a state_dict: a dict of tensors named "
                "as timm's (e.g. 'blocks.0.attn.qkv.weight'), alone or under 'model' as in the "
                "official files. Pass such a checkpoint."
            )
        return {
            key.removeprefix("module."): value.float().numpy()
            for key, value in checkpoint.items()
        }
    raise ValueError(
        f"{path!r}: unknown file type; use a .safetensors or .pth checkpoint "
        "(timm/DeiT) or a Keras .weights.h5 file."
    )
