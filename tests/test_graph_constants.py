"""graphops.Constants: the one reader of a graph's constant values that rescale, the QNN fusion
rules and the decompositions share (each had its own, each reading a different set)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortprep.graphops import Constants


def _graph():
    fed = numpy_helper.from_array(np.array([2.0], np.float32), "fed")
    weight = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "weight")
    outside = numpy_helper.from_array(np.zeros(4, np.float32), "outside")
    outside.data_location = TensorProto.EXTERNAL
    outside.ClearField("raw_data")
    outside.external_data.add(key="location", value="weights.bin")
    nodes = [
        helper.make_node("Constant", [], ["tensor"], value=numpy_helper.from_array(np.array([1.5], np.float32))),
        helper.make_node("Constant", [], ["scalar"], value_float=0.5),
        helper.make_node("Constant", [], ["ints"], value_ints=[1, 2]),
        helper.make_node("Mul", ["x", "fed"], ["y"]),
    ]
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
                                          helper.make_tensor_value_info("fed", TensorProto.FLOAT, [1])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [fed, weight, outside])


def test_constants_read_initializers_and_every_constant_form():
    constants = Constants(_graph())
    assert constants["weight"].shape == (2, 3) and float(constants["weight"][1, 2]) == 5.0
    assert float(constants["tensor"][0]) == 1.5
    assert constants["scalar"].dtype == np.float32 and float(constants["scalar"]) == 0.5
    assert constants["ints"].dtype == np.int64 and constants["ints"].tolist() == [1, 2]
    # a computed tensor, a graph input and weights stored outside the file are not read
    assert "y" not in constants and constants.get("x") is None and constants.get("outside") is None
    with pytest.raises(KeyError):
        constants["y"]


def test_an_initializer_a_caller_may_feed_is_a_constant_only_when_asked():
    assert "fed" not in Constants(_graph())
    assert float(Constants(_graph(), fed_are_constant=True)["fed"][0]) == 2.0
