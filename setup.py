from setuptools import find_packages, setup

setup(
    name="keras-cait",
    version="0.1.0",
    description='CaiT ("Going deeper with Image Transformers") for Keras 3, with the official ImageNet weights',
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["keras_cait", "keras_cait.*"]),
    package_data={"keras_cait.data": ["*.json"]},
    install_requires=[
        "keras>=3.8",
        "tensorflow>=2.18",
        "numpy",
        "safetensors",
        "h5py",
        "pillow",
    ],
    extras_require={
        "torch": ["torch"],
        # TensorBoard logs of keras-cait train and keras-cait finetune.
        "train": ["tensorboard"],
        "onnx": ["tf2onnx>=1.17", "onnx", "onnxruntime"],
        "litert": ["ai-edge-litert"],
        # NNCF: OpenVINO's own quantisation, export_openvino(quantization="int8" / "int8_weights").
        "openvino": ["openvino", "nncf"],
        "plots": ["matplotlib"],
        # keras_cait.hub: keras-hub's preset API (from_preset, save_to_preset, upload_preset), and
        # weights="imagenet" through the Hugging Face cache. Tested with keras-hub 0.32.0.
        "hub": ["keras-hub>=0.32", "huggingface_hub"],
        # keras-cait demo: scikit-learn's bundled digits, matplotlib for the attention PNGs.
        "demo": ["scikit-learn", "matplotlib"],
        "test": [
            "pytest",
            "pytest-xdist",
            "torch",
            "torchvision",
            "timm",
            "jax[cpu]",
            "tensorboard",
            "scikit-learn",
            "tf2onnx>=1.17",
            "onnx",
            "onnxruntime",
            "ai-edge-litert",
            # pip install openvino took 9 s (one 50 MB wheel, one small dependency).
            "openvino",
            "nncf",
            "matplotlib",
            "keras-hub>=0.32",
            "huggingface_hub",
            "nbclient",
            "nbformat",
            "ipykernel",
        ],
    },
    entry_points={"console_scripts": ["keras-cait=keras_cait.cli:main"]},
)
