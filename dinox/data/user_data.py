"""A team's own dataset (`data: {source: python, entry: "mypkg.data:build"}`): the entry receives a ``DataContext``
and returns a torch Dataset, map-style (``__getitem__`` and ``__len__``) or iterable (``__iter__``). dinox keeps
the DataLoader and its knobs, the repetition of a small set, the device copy and (``normalize``) the
normalisation. Imported in the trial's process and the validate child only (dinox.entrypoints)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dinox import entrypoints
from dinox.data.views import ViewPlan
from dinox.entrypoints import EntryError
from dinox.spec.data_sources import PythonData


@dataclass(frozen=True)
class DataContext:
    """What dinox decided, handed to the data entry: a sample is `views.full_size` square (classification, a
    team's own step) or one view per `views.sizes` (DINO), `channels` deep, labelled in [0, num_classes)."""

    img_size: int
    channels: int
    num_classes: int
    views: ViewPlan
    samples_needed: int  # what the measurement draws (a smaller map-style set is repeated)
    options: dict[str, Any] = field(default_factory=dict)


def build(data: PythonData, context: DataContext) -> Any:
    """The entry's dataset, checked to be one. Raises EntryError."""
    target, root = entrypoints.load(data.entry, data.path, "data.entry")
    made = entrypoints.call(target, context, data.entry, root, "data.entry")
    mapped = callable(getattr(made, "__getitem__", None)) and callable(getattr(made, "__len__", None))
    if made is None or not (mapped or callable(getattr(made, "__iter__", None))):
        what = "None" if made is None else entrypoints.a(type(made).__name__)
        raise EntryError(
            f"data.entry {data.entry}: returned {what}; it must return a torch Dataset (map-style: __getitem__ "
            "and __len__; or iterable: __iter__)"
        )
    return made


def first_sample(dataset: Any, data: PythonData) -> Any:
    """The set's first sample, as the DataLoader would fetch it. Raises EntryError with the user's own line."""
    entry, root = data.entry, str(Path(data.path).resolve())
    try:
        if callable(getattr(dataset, "__len__", None)) and callable(getattr(dataset, "__getitem__", None)):
            if len(dataset) == 0:
                raise EntryError(f"data.entry {entry}: the dataset is empty")
            return dataset[0]
        return next(iter(dataset))
    except EntryError:
        raise
    except StopIteration:
        raise EntryError(f"data.entry {entry}: the dataset yields no sample") from None
    except Exception as e:  # noqa: BLE001 - the team's code
        raise EntryError(f"data.entry {entry}: its first sample raised {entrypoints.where(e, root)}") from None
