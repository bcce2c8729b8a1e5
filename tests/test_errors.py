"""dinox.errors: what counts as an interrupt."""

from __future__ import annotations

from dinox.errors import interrupted


def _raised(make):
    try:
        make()
    except BaseException as e:  # noqa: BLE001 - the exception is the subject
        return e
    raise AssertionError("nothing raised")


def test_an_error_made_of_a_ctrl_c_is_an_interrupt_and_others_are_not():
    def init_failed():  # a C extension's module init that met the Ctrl-C (matplotlib's Agg backend)
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise ImportError("initialization failed") from e

    def during_handling():  # an error while a Ctrl-C was being handled: its context
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise OSError("write failed") from None

    def plain():
        try:
            raise ValueError("inner")
        except ValueError as e:
            raise RuntimeError("outer") from e

    ctrl_c = KeyboardInterrupt()
    assert interrupted(ctrl_c) is ctrl_c
    failed = _raised(init_failed)
    assert interrupted(failed) is failed.__cause__
    assert interrupted(_raised(during_handling)) is None  # `from None`: the code said it is not the Ctrl-C's
    assert interrupted(_raised(plain)) is None
    assert interrupted(_raised(plain), (ValueError,)) is not None  # any kind asked for
    looped = RuntimeError("a")
    looped.__context__ = RuntimeError("b")
    looped.__context__.__context__ = looped
    assert interrupted(looped) is None  # a cycle of contexts ends
