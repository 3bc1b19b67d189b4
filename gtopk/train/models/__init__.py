"""The paper's four networks. Hydra builds them from ``model.net`` (a ``_target_`` node)."""

from gtopk.train.models.cifar import VGG16, ResNet20

__all__ = ["ResNet20", "VGG16"]
