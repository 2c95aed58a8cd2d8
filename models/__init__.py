"""Network collections: the papers' architectures built with onnx.helper, and trained models
shipped inside PyPI wheels."""
