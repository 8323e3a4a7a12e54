"""Proof on the real session: its verdict, the reduction engine, and measured fixes.

A layer between the steps and the transforms: ``check --prove`` and ``load`` use :mod:`.proof`;
:mod:`.reduction` is the one bisection and delta-debugging engine with one :class:`Budget`, used by
:mod:`.culprits` (a failing session's culprit nodes) and by quantize's fewest-float search;
:mod:`.fixes` measures what makes a failing session work.
"""

from ortprep.prove.reduction import Budget, Stopped, ddmin, doubling, first_true, last_true, shortest_window

__all__ = ["Budget", "Stopped", "ddmin", "doubling", "first_true", "last_true", "shortest_window"]
