"""The task-key table (src/batch/task_keys.h) against what must agree with it: the JSON schema
(configs/batch.schema.json), the table in docs/batch-files.md, `generate`'s flags, and the "notes"
key end to end (in the manifest, no new image on a changed note).

    PYTHONPATH=tests python tests/e2e/test_task_keys.py --binary B --model TINY --work DIR --source REPO
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from e2e_common import ARGS, TestCase, main, read_manifest, sdxl

SCHEMA_TYPES = {"integer": "integer", "number": "number", "string": "string", "path": "string",
                "object": "object", "array": "array"}


def keys() -> list[dict]:
    r = sdxl("keys", "--json")
    if r.returncode != 0:
        raise SystemExit(f"keys --json failed: {r.stderr}")
    return json.loads(r.stdout)


def resolve(schema: dict, node: dict) -> dict:
    """A property's schema with its $ref followed."""
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


class TaskKeys(TestCase):
    def test_schema_has_every_key_with_its_range(self):
        schema = json.loads((Path(ARGS.source) / "configs" / "batch.schema.json").read_text())
        task_props = schema["properties"]["tasks"]["items"]["properties"]
        default_props = schema["properties"]["defaults"]["properties"]
        table = keys()
        self.assertEqual(sorted(task_props), sorted(k["name"] for k in table), "task keys: schema vs table")
        self.assertEqual(sorted(default_props), sorted(k["name"] for k in table if k["in_defaults"]),
                         "defaults keys: schema vs table")
        for k in table:
            node = resolve(schema, task_props[k["name"]])
            if k["type"] in ("integer", "number"):
                self.assertEqual(node.get("type"), k["type"], k["name"])
                self.assertEqual((node.get("minimum"), node.get("maximum")), (k["minimum"], k["maximum"]), k["name"])
                if "multiple_of" in k:
                    self.assertEqual(node.get("multipleOf"), k["multiple_of"], k["name"])
            elif k["type"] in SCHEMA_TYPES and "type" in node:
                allowed = node["type"] if isinstance(node["type"], list) else [node["type"]]
                self.assertIn(SCHEMA_TYPES[k["type"]], allowed, k["name"])
            if "choices" in k:
                self.assertEqual(sorted(node.get("enum", [])), sorted(k["choices"]), k["name"])

    def test_docs_table_is_the_tables_markdown(self):
        r = sdxl("keys", "--markdown")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = (Path(ARGS.source) / "docs" / "batch-files.md").read_text()
        self.assertIn(r.stdout.strip(), doc, "docs/batch-files.md#task-keys: paste `sdxl-batch keys --markdown`")

    def test_generate_has_each_keys_flag(self):
        r = sdxl("generate", "--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for k in keys():
            if k["generate_flag"]:
                self.assertIn(k["generate_flag"].split(",")[0], r.stdout, k["name"])

    def test_notes_reach_the_manifest_and_remake_nothing(self):
        out = Path(ARGS.work) / "notes"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        batch = {"version": 1, "defaults": {"steps": 2, "width": 64, "height": 64, "notes": "night 12"},
                 "tasks": [{"id": "a", "prompt": "a lighthouse", "seed": 1},
                           {"id": "b", "prompt": "a harbour", "seed": 2, "notes": "panel 2: the keeper\nwaves"}]}
        path = out / "batch.json"
        path.write_text(json.dumps(batch))
        r = sdxl("run", str(path), "--model", ARGS.model, "--out", str(out / "run"))
        self.assertEqual(r.returncode, 0, r.stderr)
        notes = {e["task"]: e["params"].get("notes") for e in read_manifest(out / "run")}
        self.assertEqual(notes, {"a": "night 12", "b": "panel 2: the keeper\nwaves"})
        batch["tasks"][0]["notes"] = "a new note"
        path.write_text(json.dumps(batch))
        r = sdxl("run", str(path), "--model", ARGS.model, "--out", str(out / "run"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(read_manifest(out / "run")), 2, "a changed note made an image again")

    def test_bad_notes_are_refused_at_their_pointer(self):
        out = Path(ARGS.work) / "notes-bad"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        path = out / "batch.json"
        path.write_text(json.dumps({"version": 1, "tasks": [{"id": "a", "prompt": "x", "notes": 5},
                                                            {"id": "b", "prompt": "x", "notes": "bell\u0007"}]}))
        r = sdxl("validate", str(path), "--model", ARGS.model)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        text = r.stdout + r.stderr
        self.assertIn("/tasks/0/notes", text)
        self.assertIn("/tasks/1/notes", text)


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--model", "--work", "--source"))
