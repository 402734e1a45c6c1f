// The examples of docs/clients/typescript.md run as written: each block marked
// `<!-- client-test: NAME -->` is written to a module of this package (so that
// `import ... from 'waitd'` finds it) and run with node against a live waitd.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { Fixture, TOKEN, WaitdProcess, repoRoot, unique } from "./helpers.mjs";

const page = join(repoRoot, "docs/clients/typescript.md");
const scratch = resolve(fileURLToPath(new URL("..", import.meta.url)), ".doctest");

/** The marked blocks of the page: [{ name, code }]. */
function examples() {
  const text = readFileSync(page, "utf8");
  const found = [];
  const re = /<!-- client-test: ([\w-]+) -->\s*\n```(?:js|javascript|mjs)\n([\s\S]*?)\n```/g;
  for (const m of text.matchAll(re)) found.push({ name: m[1], code: m[2] });
  const markers = text.match(/<!-- client-test:/g)?.length ?? 0;
  assert.equal(found.length, markers, "every client-test marker is followed by a ```js block");
  return found;
}

const server = new WaitdProcess();
const fixture = new Fixture();

before(async () => {
  await Promise.all([server.start(), fixture.start()]);
  mkdirSync(scratch, { recursive: true });
});
after(async () => {
  await server.dispose();
  await fixture.close();
  rmSync(scratch, { recursive: true, force: true });
});

describe("docs/clients/typescript.md", () => {
  const blocks = examples();
  test("has the examples it should", () => {
    assert.ok(blocks.length >= 5, `${blocks.length} examples`);
    assert.ok(blocks.some((b) => b.name === "first-wait"));
    assert.ok(blocks.find((b) => b.name === "first-wait").code.split("\n").length <= 10, "a first wait in ten lines");
  });
  for (const { name, code } of blocks) {
    test(`the example "${name}" runs`, async (t) => {
      const target = unique("doc");
      fixture.set(target, "on");
      const file = join(scratch, `${name}.mjs`);
      writeFileSync(file, `${code}\n`);
      const env = {
        ...process.env,
        WAITD_URL: server.url,
        WAITD_TOKEN: TOKEN,
        TARGET_URL: `${fixture.url}/state/${target}`,
      };
      const { code: exit, stdout, stderr } = await new Promise((done) => {
        execFile(process.execPath, [file], { env, timeout: 20_000 }, (err, stdout, stderr) =>
          done({ code: err ? (err.code ?? err.signal) : 0, stdout, stderr }),
        );
      });
      t.diagnostic(stdout.trim());
      assert.equal(exit, 0, `the example "${name}" failed:\n${stdout}\n${stderr}`);
      assert.ok(stdout.trim().length > 0, `the example "${name}" printed nothing`);
      if (name === "first-wait") assert.match(stdout, /^succeeded /);
      if (name === "presets-groups-list") assert.match(stdout.trim(), /^2 of 2 succeeded\n[\s\S]*\ncanceled\ncanceled by a client$/);
      if (name === "follow") assert.match(stdout, /^1 created \n2 state on\n3 succeeded /);
      if (name === "callback") assert.match(stdout, /succeeded \{ build: 42 \}/);
      if (name === "webhook") assert.match(stdout, /wait\.succeeded true/);
      if (name === "errors") assert.match(stdout, /^400 .*wnat/);
    });
  }
});
