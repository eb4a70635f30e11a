"""A pruned ultralytics YOLO, saved and loaded by fxsym, run by ultralytics' own predictor
(issue 21 §3).

``fxsym.save`` writes the weights and the plan; ``fxsym.load`` replays the plan on a model
built again from the same yaml (random weights, nothing downloaded). What the predictor reads
besides the weights (``names``, ``stride``, ``yaml``, ``args``, ``task``) is what building
from the yaml gives, so the loaded model, put back as ``YOLO(...).model``, predicts exactly
as the pruned model in memory did. The output contract (the decoded predictions, output 0)
is recorded in the plan and replayed by ``fxsym.load``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fxsym


def _built(ultralytics: Any, yaml: str) -> torch.nn.Module:
    """A model from ``yaml`` whose class scores are not all below the confidence threshold
    (ultralytics starts the class biases at log(5 / nc / 80²): no box on random weights)."""
    model = ultralytics.YOLO(yaml).model.eval()
    with torch.no_grad():
        for branch in model.model[-1].cv3:
            branch[-1].bias.zero_()
    return model


def _boxes(ultralytics: Any, yaml: str, model: torch.nn.Module, image: Any) -> torch.Tensor:
    yolo = ultralytics.YOLO(yaml)
    yolo.model = model
    (result,) = yolo.predict(image, imgsz=64, conf=0.25, verbose=False)
    assert result.names == model.names
    return result.boxes.data


@pytest.mark.parametrize(("yaml", "p5"), [("yolov8n.yaml", "model.21.cv2.conv"),
                                          ("yolo11n.yaml", "model.22.cv2.conv")])
def test_pruned_yolo_saved_loaded_and_run_by_ultralytics_predictor(
        yaml: str, p5: str, tmp_path: Path) -> None:
    ultralytics = pytest.importorskip("ultralytics")
    torch.manual_seed(0)
    model = _built(ultralytics, yaml)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        model(x)  # a user measures before pruning: Detect keeps its anchors
    # the contract is the decoded predictions, which the predictor reads; the feature maps
    # Detect also returns may change size (P4 and P5 channels become groups)
    sm = fxsym.analyze(model, example_inputs=(x,), outputs=[0])
    assert f"{p5}.out_channels" in [g.name for g in sm.groups()]
    params = sum(p.numel() for p in model.parameters())
    plan = fxsym.plan(model, sm, ratio=0.3)
    plan.apply(model, sm)
    assert sum(p.numel() for p in model.parameters()) < 0.8 * params
    fxsym.save(model, tmp_path, plan)

    loaded = fxsym.load(_built(ultralytics, yaml), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(x)[0], model(x)[0])
    image = (np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8)
    got = _boxes(ultralytics, yaml, loaded, image)
    expected = _boxes(ultralytics, yaml, copy.deepcopy(model), image)
    assert len(got) > 0
    assert torch.equal(got, expected)
