"""product_classifier: a 5-class product-photo classifier, trained with plain PyTorch.

Modules: `data` (synthetic image folders and the Dataset), `model` (the ResNet) and `train`
(the loop and its CLI, `python -m product_classifier.train`). The package imports nothing
eagerly so that running `-m product_classifier.train` does not import the module twice.
"""

__version__ = "0.1.0"
