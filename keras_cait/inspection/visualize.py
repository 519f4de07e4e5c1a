"""The paper's attention figures as matplotlib figures (needs `pip install "keras-cait[plots]"`).

- `class_attention_figure`: for one image, the map of every head of every
  class-attention block over the image (the paper's Fig. 6).
- `saliency_figure`: images with the head-averaged map of the first
  class-attention block upsampled over them (the paper's Fig. 7).

Both take the `AttentionMaps` of `keras_cait.attention_maps` and return a
`matplotlib.figure.Figure` (not registered with pyplot: no GUI needed, nothing
global changes); `save_figure` writes one to a PNG.

    maps = keras_cait.attention_maps(model, images)
    save_figure(class_attention_figure(images, maps), "heads.png")
    save_figure(saliency_figure(images, maps), "saliency.png")
"""

import numbers
import os

import numpy as np

from keras_cait.errors import ArgumentError, counted
from keras_cait.io.atomic import unwritable, written_atomically

PANEL_INCHES = 1.6
OVERLAY_ALPHA = 0.6


def _figure(rows, cols):
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            "keras_cait.inspection.visualize draws with matplotlib, which is not installed. "
            'Install it with: pip install "keras-cait[plots]"'
        ) from error
    figure = Figure(figsize=(cols * PANEL_INCHES, rows * PANEL_INCHES), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    return figure, axes


def _displayable(image):
    """An image as matplotlib shows it: floats in [0, 1], grey images 2-D."""
    image = np.asarray(image, dtype=np.float32)
    if image.min() < 0 or image.max() > 255:  # normalised inputs: stretch for display
        image = (image - image.min()) / max(float(np.ptp(image)), 1e-12)
    elif image.max() > 1:
        image = image / 255.0
    return image[..., 0] if image.shape[-1] == 1 else image


def _checked_maps(maps, images=None):
    """`maps` where it is an `AttentionMaps`, else an `ArgumentError` naming `maps` (and the order of
    the arguments where `images` is the maps: the two swapped)."""
    from keras_cait.inspection.attention import AttentionMaps

    if isinstance(maps, AttentionMaps):
        return maps
    shape = getattr(maps, "shape", None)
    shown = f"<{type(maps).__name__} of shape {tuple(shape)}>" if shape is not None else (
        None if maps is None or isinstance(maps, (str, numbers.Number)) else f"<{type(maps).__name__}>")
    swapped = isinstance(images, AttentionMaps)
    raise ArgumentError(
        "maps", maps, f"must be the AttentionMaps of keras_cait.attention_maps, not {type(maps).__name__}"
        + (" (images and maps are swapped)" if swapped else ""),
        "images first, then maps: e.g. saliency_figure(images, keras_cait.attention_maps(model, images))",
        usage=True, shown=shown)


class _OutOfRange(ArgumentError, IndexError):
    """A `sample` or `block` that is no index of the maps: an ArgumentError naming it, and the
    IndexError it was."""


def _check(images, maps, samples, argument="samples"):
    images = np.asarray(images)
    batch = maps.class_attention[0].shape[0]
    if images.ndim != 4 or len(images) != batch:
        raise ValueError(
            f"images of shape {images.shape}: expected the batch of {batch} images the maps "
            "were computed from, as (batch, height, width, channels)."
        )
    for sample in samples:
        if isinstance(sample, bool) or not isinstance(sample, numbers.Integral) or not -batch <= sample < batch:
            one = argument == "sample"
            index = isinstance(sample, numbers.Integral) and not isinstance(sample, bool)
            what = "is" if one else f"holds {sample!r},"
            raise _OutOfRange(argument, sample if one else samples,
                              f"{what} no index of the {batch} images the maps hold"
                              + ("" if index else f" (an index is an integer, not a {type(sample).__name__})"),
                              f"e.g. {argument}={0 if one else [0]} (indices 0 to {batch - 1})", usage=True)
    return images


def _overlay(ax, image, heat):
    """The image with a heat map stretched over it (bilinear, from the patch grid)."""
    height, width = image.shape[:2]
    ax.imshow(image, cmap="gray")
    ax.imshow(heat, cmap="inferno", alpha=OVERLAY_ALPHA, extent=(0, width, height, 0),
              interpolation="bilinear")


def _checked_block(maps, block):
    blocks = len(maps.class_attention)
    if isinstance(block, bool) or not isinstance(block, numbers.Integral) or not -blocks <= block < blocks:
        raise _OutOfRange("block", block, f"is no index of the {blocks} class-attention blocks the maps hold",
                          f"e.g. block=0 (indices 0 to {blocks - 1})", usage=True)
    return block


def saliency_map(maps, size, block=0):
    """The head-averaged class attention of `block`, upsampled to `size`, scaled to [0, 1].

    Args:
        maps: `AttentionMaps` of a batch of images.
        size: `(height, width)` of the images.
        block: which class-attention block (0, the first, as in the paper's Fig. 7).

    Returns:
        float32 array `(batch, height, width)`, each image's maximum 1.
    """
    from keras import ops

    maps = _checked_maps(maps)
    if isinstance(size, (str, bytes)) or not hasattr(size, "__len__") or len(size) != 2 or not all(
            isinstance(side, numbers.Integral) and not isinstance(side, bool) and side > 0 for side in size):
        raise ArgumentError("size", size, "must be the (height, width) of the images, two positive integers",
                            "e.g. size=(224, 224), or images.shape[1:3]", usage=True)
    grid = maps.class_attention[_checked_block(maps, block)].mean(axis=1)[..., None]  # (batch, rows, cols, 1)
    upsampled = ops.convert_to_numpy(ops.image.resize(grid, tuple(size), interpolation="bilinear"))[..., 0]
    low = upsampled.min(axis=(1, 2), keepdims=True)
    high = upsampled.max(axis=(1, 2), keepdims=True)
    return ((upsampled - low) / np.maximum(high - low, 1e-12)).astype(np.float32)


def class_attention_figure(images, maps, sample=0):
    """Every head's class attention, one row per class-attention block, over one image.

    Args:
        images: the batch `(batch, height, width, channels)` the maps come from.
        maps: its `AttentionMaps`.
        sample: which image of the batch.

    Returns:
        A Figure of `blocks × (1 + heads)` panels: the image, then one per head.
    """
    maps = _checked_maps(maps, images)
    images = _check(images, maps, [sample], argument="sample")
    image = _displayable(images[sample])
    heads = maps.class_attention[0].shape[1]
    figure, axes = _figure(len(maps.class_attention), 1 + heads)
    for block, grid in enumerate(maps.class_attention):
        axes[block, 0].imshow(image, cmap="gray")
        axes[block, 0].set_title(f"class attention {block + 1}", fontsize=8)
        for head in range(heads):
            _overlay(axes[block, 1 + head], image, grid[sample, head])
            axes[block, 1 + head].set_title(f"head {head + 1}", fontsize=8)
    return figure


def _listed_samples(samples):
    """`samples` as a list of indices: one index (`samples=0`) or a str is refused naming it, not a
    TypeError from `list(0)` or the str's characters taken one by one; an empty list draws nothing."""
    if isinstance(samples, np.ndarray):
        samples = samples.tolist()
    if isinstance(samples, (str, bytes, numbers.Number)) or not hasattr(samples, "__iter__"):
        raise ArgumentError("samples", samples, "must be a list of image indices",
                            [f"e.g. samples=[{int(samples)}]" if isinstance(samples, numbers.Integral)
                             and not isinstance(samples, bool) else "e.g. samples=[0, 1]",
                             ", or leave it out for every image"], usage=True)
    samples = list(samples)
    if not samples:
        raise ArgumentError("samples", samples, "names no image to show", "e.g. samples=[0], or leave it out for "
                            "every image", usage=True)
    return samples


def saliency_figure(images, maps, samples=None, block=0, labels=None):
    """Images (top row) and their class-attention saliency (bottom row).

    Args:
        images: the batch `(batch, height, width, channels)` the maps come from.
        maps: its `AttentionMaps`.
        samples: indices of the images to show (default: all of them).
        block: which class-attention block's map (default the first).
        labels: optional title per shown image, e.g. the predicted class.

    Returns:
        A Figure of `2 × len(samples)` panels.
    """
    maps = _checked_maps(maps, images)
    samples = list(range(len(maps.class_attention[0]))) if samples is None else _listed_samples(samples)
    images = _check(images, maps, samples)
    if isinstance(labels, (str, bytes)):  # its characters were taken as the titles, one per image
        raise ArgumentError("labels", labels, "must be a list of titles, one per image shown, not a str",
                            f"e.g. labels={[labels] * len(samples)!r}" if len(samples) <= 3 else "e.g. labels=['cat', "
                            "'dog']", usage=True)
    labels = None if labels is None else list(labels)
    if labels is not None and len(labels) != len(samples):
        raise ArgumentError("labels", labels, f"{counted(len(labels), 'title')} for {counted(len(samples), 'image')} shown",
                            "give one per image of `samples`, in its order, or leave labels out",
                            shown=None if len(labels) <= 6 else f"[{len(labels)} titles]")
    saliency = saliency_map(maps, images.shape[1:3], block)
    figure, axes = _figure(2, len(samples))
    for column, sample in enumerate(samples):
        image = _displayable(images[sample])
        axes[0, column].imshow(image, cmap="gray")
        if labels is not None:
            axes[0, column].set_title(str(labels[column]), fontsize=8)
        axes[1, column].imshow(image, cmap="gray")
        axes[1, column].imshow(saliency[sample], cmap="inferno", alpha=OVERLAY_ALPHA)
    return figure


def save_figure(figure, path, dpi=100):
    """Writes `figure` as a PNG to `path` (a file ending in .png) through a temporary file, so never
    half-written, at `dpi` (a positive number) dots per inch. An existing file is replaced; an existing
    folder is refused, never replaced."""
    shown = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(shown, str):
        raise ArgumentError("path", path, f"must be a file path ending in .png, not {type(path).__name__}",
                            "e.g. save_figure(figure, 'saliency.png')", usage=True)
    if os.path.isdir(shown):
        raise ArgumentError("path", path, "is a folder, which save_figure would replace with one PNG file",
                            f"give a file in it, e.g. {os.path.join(shown, 'saliency.png')!r}", usage=True)
    if not shown.lower().endswith(".png"):
        raise ArgumentError("path", path, "save_figure writes a PNG, so the file must end in .png",
                            "e.g. 'saliency.png'", usage=True)
    problem = unwritable(os.path.dirname(os.path.abspath(shown)), given=shown)
    if problem:  # a path inside a file was os.makedirs' raw FileExistsError
        raise ArgumentError("path", path, *problem, usage=True)
    if not callable(getattr(figure, "savefig", None)):  # a bare AttributeError on savefig
        raise ArgumentError("figure", figure, f"must be a matplotlib Figure, not a {type(figure).__name__}",
                            "e.g. save_figure(saliency_figure(images, maps), 'saliency.png')", usage=True,
                            shown=None if figure is None or isinstance(figure, (str, numbers.Number))
                            else f"<{type(figure).__name__}>")
    if isinstance(dpi, bool) or not isinstance(dpi, numbers.Real) or not 0 < dpi < float("inf"):
        raise ArgumentError("dpi", dpi, "must be a positive number of dots per inch", "e.g. dpi=100 (the default) "
                            "or dpi=200 for print", usage=True)
    with written_atomically(path) as partial:
        figure.savefig(partial, format="png", dpi=dpi)
    return path
