import { createHash } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { buildPlanReport } from '../../../src/cli/plan/report.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { thrown } from '../../helpers/kata-error.js';
import { fixturePlanEnvironment } from '../../helpers/plan-env.js';

const DOC = 'version = "0.1.0"\nalgorithm = "sha256"\n[data]\n"policy.rego" = "package agent_policy\\ndefault allow = true\\n"\n';
const ANNOTATION = gzipSync(Buffer.from(DOC)).toString('base64');
const request = (handler: string, annotations: Record<string, string> = {}) => ({
  runtime_handler: handler,
  config: { metadata: { name: 'p', namespace: 'n', uid: 'u', attempt: 0 }, annotations },
});
const flagValues = (argv: string[], flag: string): string[] =>
  argv.flatMap((a, i) => (a === flag && argv[i + 1] !== undefined ? [argv[i + 1]!] : []));
const no = { ok: false, message: 'none' };
const yes = { ok: true, message: 'present' };

describe('the TEE as a plan fact', () => {
  it('kata-ts-cvm on a host without SNP or TDX: vtpm, the initdata document handed over fw_cfg', async () => {
    const env = await fixturePlanEnvironment({ cpus: 8, memoryMiB: 16_384 });
    const report = buildPlanReport(request('kata-ts-cvm', { 'io.katacontainers.config.hypervisor.cc_init_data': ANNOTATION }), {
      ...env,
      tee: { host: { snp: no, tdx: no }, qemuVersion: { major: 7, minor: 2, micro: 22 } },
    });
    expect(report.tee).toMatchObject({ setting: 'auto', kind: 'vtpm', reason: 'no SNP or TDX on this host', launchProblem: null });
    expect(report.tee?.initdataPath).toMatch(/\/initdata\.toml$/);
    expect(flagValues(report.qemu.argv, '-fw_cfg')).toEqual([`name=opt/org.kata-ts/initdata,file=${report.tee?.initdataPath}`]);
  });

  it('kata-ts-cvm on an SNP host: snp, HOST_DATA is the sha256 of the document; Debian 12 QEMU cannot start it', async () => {
    const env = await fixturePlanEnvironment({ cpus: 8, memoryMiB: 16_384 });
    const report = buildPlanReport(request('kata-ts-cvm', { 'io.kata-ts.initdata': ANNOTATION }), {
      ...env,
      tee: { host: { snp: yes, tdx: no }, qemuVersion: { major: 7, minor: 2, micro: 22 } },
    });
    expect(report.tee?.kind).toBe('snp');
    expect(report.tee?.launchProblem).toMatch(/QEMU 7\.2\.22 cannot start SEV-SNP/);
    const hostData = createHash('sha256').update(DOC).digest('base64');
    expect(flagValues(report.qemu.argv, '-object')).toContain(
      `sev-snp-guest,id=sev0,cbitpos=51,reduced-phys-bits=1,kernel-hashes=on,host-data=${hostData}`,
    );
  });

  it('the default handler has no TEE, and a pod with initdata on it is refused naming the annotation', async () => {
    const env = await fixturePlanEnvironment({ cpus: 8, memoryMiB: 16_384 }, 'no-iommu', defaultConfig());
    expect(buildPlanReport(request('kata-ts'), env).tee).toMatchObject({ kind: 'none', firmware: null, tpm: null });
    const err = thrown(() => buildPlanReport(request('kata-ts', { 'io.kata-ts.initdata': ANNOTATION }), env));
    expect(err.reason).toBe('MEASURE_INITDATA_NO_TEE');
    expect(err.message).toContain('io.kata-ts.initdata');
  });
});
