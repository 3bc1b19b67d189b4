"""The paper's four networks. Hydra builds them from ``model.net`` (a ``_target_`` node)."""

from gtopk.models.cifar import ResNet20, VGG16

__all__ = ["ResNet20", "VGG16"]
