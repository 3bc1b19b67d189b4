"""What every data source is: a ``DataSource`` (checked in the launching process, loaded in
each worker), the ``DataError`` its check raises, and the checks of the settings the
image sources share (``data.image_size``, ``data.channels``, the first-n subsets)."""

from __future__ import annotations

from torch.utils.data import Dataset

#: the smallest ``data.image_size`` any image source takes (pixels per side)
MIN_IMAGE_SIZE = 8


class DataError(ValueError):
    """A dataset is missing or malformed, or a ``data.*`` setting is invalid."""


class DataSource:
    """A dataset family; Hydra builds one from ``cfg.data`` (``_target_``).

    ``check()`` runs in the launching process before any worker starts; ``datasets()`` runs
    in each worker and returns (train, test) with the paper's augmentations;
    ``sample_shape()`` is one input's shape (channels, height, width) when known, for the
    check that the model takes it (``gtopk.run.checks.model_takes``).
    """

    name = "base"

    def check(self) -> int | None:
        """Raise DataError naming the path looked at and how to get the data, if the data
        is missing or cannot be read; return the number of training samples when known."""
        return None

    def datasets(self) -> tuple[Dataset, Dataset]:
        raise NotImplementedError

    def sample_shape(self) -> tuple[int, ...] | None:
        """One input's shape as the model receives it (None: not known before loading)."""
        return None


def check_image_size(value: object, example: int = 32) -> None:
    """``data.image_size`` is an integer of at least ``MIN_IMAGE_SIZE`` pixels."""
    if not isinstance(value, int) or isinstance(value, bool) or value < MIN_IMAGE_SIZE:
        raise DataError(
            f"data.image_size={value!r} must be an integer >= {MIN_IMAGE_SIZE} (pixels per side), e.g. {example}"
        )


def check_channels(value: object, allowed: tuple[int, ...], what: str) -> None:
    """``data.channels`` is one this source can deliver."""
    if value not in allowed or isinstance(value, bool):
        choices = " or ".join(str(c) for c in allowed)
        raise DataError(f"data.channels={value!r}: {what}; use data.channels={choices}")


def check_subset(key: str, value: object, most: int) -> None:
    """``data.<key>`` (the first n images of a split) is null or an integer in [1, most]."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most):
        raise DataError(f"data.{key}={value!r} must be an integer in [1, {most}], or null for all")
