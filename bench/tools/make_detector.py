#!/usr/bin/env python3
"""A detector checkpoint of ADetailer's size for the GPU figures: Ultralytics' yolov8n.yaml at 640 px,
one class "face", seeded random weights with the class bias calibrated as the test fixtures do
(reference.detector_fixtures: a few anchors of its test images score above 0.25, so NMS has work).

    PYTHONPATH=tests python3 bench/tools/make_detector.py OUT.pt
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import reference.detector_fixtures as fixtures


def main() -> int:
    out = Path(sys.argv[1])
    fixtures.offline_env()
    fixtures.IMGSZ = 640  # face_yolov8n.pt's training size (the fixtures use 320)
    model = fixtures._build("yolov8n.yaml", {0: "face"}, seed=1, task="detect")
    with tempfile.TemporaryDirectory() as tmp:
        fixtures._calibrate(model, fixtures.make_images(Path(tmp)))
    fixtures._save(model, out, "detect")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
