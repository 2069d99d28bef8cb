import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { loadPlanRequest } from '../../../src/cli/plan/load.js';
import { planJson, planText } from '../../../src/cli/plan/output.js';
import type { PlanEnvironment } from '../../../src/cli/plan/report.js';
import { buildPlanReport } from '../../../src/cli/plan/report.js';
import { packageRoot } from '../../../src/common/paths.js';
import { fixturePlanEnvironment } from '../../helpers/plan-env.js';
import { BIG_HOST } from '../../helpers/sizing-pods.js';
import { encodeProtoJson } from '../../helpers/sizing-protojson.js';

let env: PlanEnvironment;
beforeAll(async () => {
  // The guest image's dm-verity table, fixed (a real one comes from guest.img.verity.json): a TEE
  // pod's golden command line carries it, the default handler's does not.
  const guestImageVerity = { rootHash: '0f'.repeat(32), salt: 'f0'.repeat(32), dataBlocks: 23_552, hashStartBlock: 23_552 };
  env = { ...(await fixturePlanEnvironment({ ...BIG_HOST })), guestImageVerity };
});

/**
 * fixtures/pods/: each pod as a Kubernetes manifest (<pod>.pod.yaml), as the RunPodSandboxRequest
 * a KEP-4112 kubelet would send (<pod>.request.json, proto3 JSON) and its expected plan
 * (<pod>.plan.json) for the built-in config on a 64-CPU, 256 GiB host. The README there explains
 * every number. Both request forms must give exactly the golden plan.
 *
 * KATA_UPDATE_FIXTURES=1 rewrites the .request.json and .plan.json files from the manifests, for
 * review in the diff; without it the files are only read and compared.
 */
const DIR = path.join(packageRoot(), 'fixtures', 'pods');
const PODS = ['web-sidecar', 'migration', 'hugepages-db', 'gpu-inference', 'besteffort', 'pod-level'];
const UPDATE = process.env.KATA_UPDATE_FIXTURES === '1';

function plan(text: string, file: string) {
  const { form, request } = loadPlanRequest(text, file);
  return { form, request, json: planJson(buildPlanReport(request, env)) };
}

function readOrWrite(file: string, produce: () => unknown): unknown {
  const full = path.join(DIR, file);
  if (UPDATE) writeFileSync(full, `${JSON.stringify(produce(), null, 2)}\n`);
  if (!existsSync(full))
    throw new Error(`${full} is missing: run KATA_UPDATE_FIXTURES=1 npx vitest run ${path.relative(packageRoot(), import.meta.filename)}`);
  return JSON.parse(readFileSync(full, 'utf8')) as unknown;
}

describe('fixtures/pods: both forms of each pod plan exactly as the golden', () => {
  it.each(PODS)('%s', (pod) => {
    const manifestFile = path.join(DIR, `${pod}.pod.yaml`);
    const fromManifest = plan(readFileSync(manifestFile, 'utf8'), manifestFile);
    expect(fromManifest.form).toBe('manifest');

    const requestJson = readOrWrite(`${pod}.request.json`, () => encodeProtoJson('runtime.v1.RunPodSandboxRequest', fromManifest.request));
    const requestFile = path.join(DIR, `${pod}.request.json`);
    const fromRequest = plan(JSON.stringify(requestJson), requestFile);
    expect(fromRequest.form).toBe('protojson');

    const golden = readOrWrite(`${pod}.plan.json`, () => fromManifest.json);
    expect(fromManifest.json).toEqual(golden);
    expect(fromRequest.json).toEqual(golden);
  });

  it("the text says how far a pod's overhead falls short of its VM, and only then", () => {
    const text = (pod: string) => {
      const file = path.join(DIR, `${pod}.pod.yaml`);
      return planText(buildPlanReport(loadPlanRequest(readFileSync(file, 'utf8'), file).request, env));
    };
    // migration sends no overhead: guest 160 + VMM 96 + cache 64 + balloon 1 MiB are short.
    expect(text('migration')).toMatch(/pod overhead short +321Mi: /);
    // gpu-inference's RuntimeClass covers its VM.
    expect(text('gpu-inference')).not.toContain('pod overhead short');
  });

  it('covers every source of the issue: sidecars, init peak, hugepages, extended resources, BestEffort, pod-level', () => {
    const goldens = PODS.map(
      (pod) =>
        JSON.parse(readFileSync(path.join(DIR, `${pod}.plan.json`), 'utf8')) as {
          vm: { hugepages: unknown[] };
          workload: { extended: Record<string, string>; cpuLimitMillicores: number };
          containers: Array<{ type: string }>;
        },
    );
    expect(goldens.some((g) => g.containers.some((c) => c.type === 'SIDECAR_CONTAINER'))).toBe(true);
    expect(goldens.some((g) => g.containers.some((c) => c.type === 'INIT_CONTAINER'))).toBe(true);
    expect(goldens.some((g) => g.vm.hugepages.length === 2)).toBe(true);
    expect(goldens.some((g) => Object.keys(g.workload.extended).includes('nvidia.com/gpu'))).toBe(true);
    expect(goldens.some((g) => g.workload.cpuLimitMillicores === 0)).toBe(true);
  });
});
