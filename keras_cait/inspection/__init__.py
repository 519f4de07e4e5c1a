"""Looking inside a CaiT: what its blocks attend to and what they compute.

    attention   `attention_maps(model, images)`: the class- and self-attention maps, read with the
                model's own weights (`AttentionMaps`)
    features    `forward_intermediates` and `feature_extractor`: chosen self-attention blocks'
                outputs, as timm's `forward_intermediates`
    visualize   the paper's attention figures with matplotlib (`pip install "keras-cait[plots]"`)

`keras_cait.attention_maps`, `keras_cait.AttentionMaps`, `keras_cait.forward_intermediates` and
`keras_cait.feature_extractor` are these functions; the figures are imported from `visualize`.
"""

from keras_cait.inspection.attention import AttentionMaps, attention_maps
from keras_cait.inspection.features import feature_extractor, forward_intermediates

__all__ = ["AttentionMaps", "attention_maps", "feature_extractor", "forward_intermediates"]
