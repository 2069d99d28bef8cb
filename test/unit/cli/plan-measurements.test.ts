/**
 * `kata-ts plan --measurements`: the launch inputs read back out of a planned argv, the initdata
 * annotations, the reference-values document built from a real plan (the vtpm device added to
 * its argv as the vtpm profile adds it) and the CLI's refusals.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { afterAll, describe, expect, it } from 'vitest';
import { measurementsOutput, plannedReferenceValues } from '../../../src/cli/plan/measurements.js';
import { buildPlanReport } from '../../../src/cli/plan/report.js';
import { runPlanCommand } from '../../../src/cli/plan.js';
import { packageRoot } from '../../../src/common/paths.js';
import { guestImageVerityDocument, verityKernelParam } from '../../../src/hypervisor/guest-verity.js';
import { q35RamBelow4GiBBytes } from '../../../src/measure/bzimage.js';
import { parseInitdataDocument, snpHostData } from '../../../src/measure/initdata.js';
import { launchInputsFromArgv } from '../../../src/measure/launch.js';
import { sha256 } from '../../../src/measure/pcr.js';
import { checkReferenceValues } from '../../../src/measure/reference-values.js';
import { cpuSignatureFromCpuinfo, snpMeasurement } from '../../../src/measure/snp.js';
import { predictVtpm } from '../../../src/measure/vtpm.js';
import { thrown } from '../../helpers/kata-error.js';
import { fixturePlanEnvironment } from '../../helpers/plan-env.js';

const OVMF_CODE = '/usr/share/OVMF/OVMF_CODE_4M.fd';
const OVMF_VARS = '/usr/share/OVMF/OVMF_VARS_4M.fd';
const POD = path.join(packageRoot(), 'fixtures', 'pods', 'besteffort.pod.yaml');

const dir = mkdtempSync(path.join(os.tmpdir(), 'plan-measurements-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
// A guest image with its dm-verity table beside it: a TEE pod's command line carries the table (the
// image's bytes are not read by the prediction), and without it the pod is refused.
const GUEST_IMAGE = path.join(dir, 'guest.img');
const VERITY = { rootHash: '3c'.repeat(32), salt: 'c3'.repeat(32), dataBlocks: 25_360, hashStartBlock: 25_360 };
writeFileSync(GUEST_IMAGE, '');
writeFileSync(`${GUEST_IMAGE}.verity.json`, JSON.stringify(guestImageVerityDocument(VERITY)));

const VTPM_ARGS = [
  ...['-drive', `if=pflash,format=raw,unit=0,readonly=on,file=${OVMF_CODE}`],
  ...['-drive', 'if=pflash,format=raw,unit=1,file=/var/lib/kata-ts/vm/x/vmm/ovmf,,vars.fd'],
  ...['-chardev', 'socket,id=tpmchr,path=/var/lib/kata-ts/vm/x/tpm/swtpm.sock'],
  ...['-tpmdev', 'emulator,id=tpm0,chardev=tpmchr'],
  ...['-device', 'tpm-crb,id=tpmdev0,tpmdev=tpm0'],
];

const annotation = (doc: string): string => gzipSync(Buffer.from(doc)).toString('base64');
/** An initdata document in Kata's format (src/measure/initdata.ts). */
const INITDATA = 'version = "0.1.0"\nalgorithm = "sha256"\n\n[data]\n"policy.rego" = "allow"\n';

describe('reference values of a planned pod', () => {
  it('a VM without a vTPM has nothing to predict: a coded error naming the handler', async () => {
    const { loadPlanRequest } = await import('../../../src/cli/plan/load.js');
    const env = await fixturePlanEnvironment({ cpus: 8, memoryMiB: 16384 });
    const report = buildPlanReport(loadPlanRequest(readFileSync(POD, 'utf8'), POD).request, env, 'kata-ts');
    const e = thrown(() =>
      plannedReferenceValues({ report, ovmfVarsTemplatePath: OVMF_VARS, read: () => Buffer.alloc(0), cpuinfo: () => '' }),
    );
    expect(e.reason).toBe('MEASURE_NO_VTPM');
    expect(e.message).toMatch(/handler kata-ts/);
  });

  const kernelPath = '/usr/local/share/kata-ts/guest/vmlinuz';
  it.skipIf(!existsSync(kernelPath) || !existsSync(OVMF_VARS) || !existsSync(OVMF_CODE))(
    "equals predictVtpm on the plan's own kernel, initrd, cmdline and memory; the document passes its schema; text and rvps views",
    async () => {
      const { loadPlanRequest } = await import('../../../src/cli/plan/load.js');
      const env = await fixturePlanEnvironment({ cpus: 8, memoryMiB: 16384 });
      const base = buildPlanReport(loadPlanRequest(readFileSync(POD, 'utf8'), POD).request, env, 'kata-ts');
      const report = { ...base, qemu: { ...base.qemu, argv: [...base.qemu.argv, ...VTPM_ARGS] } };
      const inputs = launchInputsFromArgv(report.qemu.argv);
      const initrd = Buffer.from('stands in for the planned initramfs');
      const read = (p: string): Buffer => (p === inputs.initrdPath ? initrd : readFileSync(p));
      const doc = plannedReferenceValues({
        report,
        ovmfVarsTemplatePath: OVMF_VARS,
        annotations: { 'io.kata-ts.initdata': annotation(INITDATA) },
        read,
        cpuinfo: () => '',
      });
      const expected = predictVtpm({
        kernel: readFileSync(inputs.kernelPath),
        initrd,
        cmdline: inputs.cmdline,
        ramBelow4GiBBytes: q35RamBelow4GiBBytes(inputs.memoryBytes),
        ovmfVars: readFileSync(OVMF_VARS),
        initdataDigestSha256: sha256(INITDATA),
      });
      expect(checkReferenceValues(JSON.parse(measurementsOutput(doc, 'json')))).toEqual(doc);
      expect(doc.vtpm?.pcrs).toEqual(Object.fromEntries(Object.entries(expected.pcrs)));
      expect(doc.inputs.initdataSha256).toBe(sha256(INITDATA).toString('hex'));
      expect(doc.inputs.cmdline).toBe(inputs.cmdline);
      const text = measurementsOutput(doc, 'text');
      for (const pcr of ['4', '7', '8', '9']) expect(text).toContain(`PCR  ${pcr}  ${doc.vtpm?.pcrs[pcr]}`);
      expect(text).toContain('Not predicted');
      const rvps = JSON.parse(measurementsOutput(doc, 'rvps'));
      expect(JSON.parse(Buffer.from(rvps.payload, 'base64').toString())).toMatchObject({ tpm_pcr4: [doc.vtpm?.pcrs['4']] });
    },
  );
});

describe('kata-ts plan --measurements', () => {
  const config = path.join(dir, 'config.json');
  // vtpm explicitly: `auto` would pick SNP or TDX on a host that has one.
  writeFileSync(
    config,
    JSON.stringify({ hypervisor: { guestImagePath: GUEST_IMAGE }, handlers: { 'kata-ts-cvm': { tee: { kind: 'vtpm' } } } }),
  );
  const io = (): { io: { stdout: Writable; stderr: Writable }; out: () => string; err: () => string } => {
    let out = '';
    let err = '';
    const w = (append: (s: string) => void): Writable =>
      new Writable({
        write(chunk: Buffer | string, _e, done) {
          append(chunk.toString());
          done();
        },
      });
    return { io: { stdout: w((s) => (out += s)), stderr: w((s) => (err += s)) }, out: () => out, err: () => err };
  };

  const haveFiles = [
    '/usr/local/share/kata-ts/guest/vmlinuz',
    '/usr/local/share/kata-ts/guest/initramfs.cpio.gz',
    OVMF_CODE,
    OVMF_VARS,
  ].every((f) => existsSync(f));
  it.skipIf(!haveFiles)("a kata-ts-cvm pod (vtpm here): the reference values of the plan's own argv, in all three formats", async () => {
    const plain = io();
    expect(await runPlanCommand(['--request', POD, '--config', config, '--handler', 'kata-ts-cvm', '--format', 'json'], plain.io)).toBe(0);
    const argv: string[] = JSON.parse(plain.out()).qemu.argv;
    const json = io();
    expect(
      await runPlanCommand(
        ['--measurements', '--request', POD, '--config', config, '--handler', 'kata-ts-cvm', '--format', 'json'],
        json.io,
      ),
    ).toBe(0);
    const doc = checkReferenceValues(JSON.parse(json.out()));
    expect(doc.tee).toBe('vtpm');
    expect(doc.handler).toBe('kata-ts-cvm');
    expect(doc.inputs.cmdline).toBe(argv[argv.indexOf('-append') + 1]);
    expect(doc.inputs.cmdline.split(' ')).toContain(verityKernelParam(VERITY));
    expect(Object.keys(doc.vtpm?.pcrs ?? {})).toEqual(['4', '7', '8', '9']);
    expect(doc.vtpm?.notPredicted.map((n) => n.pcr)).toEqual([0, 1, 2, 3, 5, 6]);
    const text = io();
    expect(await runPlanCommand(['--measurements', '--request', POD, '--config', config, '--handler', 'kata-ts-cvm'], text.io)).toBe(0);
    expect(text.out()).toContain(`PCR  4  ${doc.vtpm?.pcrs['4']}`);
    const rvps = io();
    expect(
      await runPlanCommand(
        ['--measurements', '--request', POD, '--config', config, '--handler', 'kata-ts-cvm', '--format', 'rvps'],
        rvps.io,
      ),
    ).toBe(0);
    expect(JSON.parse(Buffer.from(JSON.parse(rvps.out()).payload, 'base64').toString())).toEqual({
      tpm_pcr4: [doc.vtpm?.pcrs['4']],
      tpm_pcr7: [doc.vtpm?.pcrs['7']],
      tpm_pcr8: [doc.vtpm?.pcrs['8']],
      tpm_pcr9: [doc.vtpm?.pcrs['9']],
    });
  });

  it('refuses a format it has no view for, and a handler without a vTPM, in one line each', async () => {
    const a = io();
    expect(await runPlanCommand(['--measurements', '--request', POD, '--config', config, '--format', 'yaml'], a.io)).toBe(2);
    expect(a.err()).toMatch(/^kata-ts plan: --format must be text, json or rvps with --measurements/);
    const b = io();
    expect(await runPlanCommand(['--measurements', '--request', POD, '--config', config, '--handler', 'kata-ts'], b.io)).toBe(2);
    expect(b.err()).toMatch(/MEASURE_NO_VTPM\]\n$/);
    expect(b.err().trimEnd().split('\n')).toHaveLength(1);
    expect(b.out()).toBe('');
  });

  it('refuses a TEE pod whose guest image has no dm-verity metadata, as RunPodSandbox does', async () => {
    const bare = path.join(dir, 'bare.json');
    writeFileSync(
      bare,
      JSON.stringify({
        hypervisor: { guestImagePath: path.join(dir, 'bare.img') },
        handlers: { 'kata-ts-cvm': { tee: { kind: 'vtpm' } } },
      }),
    );
    const out = io();
    expect(await runPlanCommand(['--measurements', '--request', POD, '--config', bare, '--handler', 'kata-ts-cvm'], out.io)).toBe(1);
    expect(out.err()).toMatch(/bare\.img\.verity\.json.*\[GUEST_IMAGE_UNVERIFIED\]\n$/);
    expect(out.out()).toBe('');
  });

  // The SNP profile planned on a machine without SEV-SNP (the lab's case): the launch digest that
  // pod would have on that hardware. The firmware is sev-snp-measure's Apache-2.0 OVMF fixture
  // (test/fixtures/measure), which carries the SNP metadata and kernel hashes range.
  const SNP_FIRMWARE = path.join(packageRoot(), 'test', 'fixtures', 'measure', 'ovmf_AmdSev_suffix.bin');
  const CPUINFO = '/proc/cpuinfo';
  const haveSnpInputs = haveFiles && existsSync(CPUINFO) && /^cpu family/m.test(existsSync(CPUINFO) ? readFileSync(CPUINFO, 'utf8') : '');
  it.skipIf(!haveSnpInputs)(
    "an snp handler, planned here: the launch digest of the plan's own argv and files, with HOST_DATA from initdata",
    async () => {
      const snpConfig = path.join(dir, 'snp.json');
      writeFileSync(
        snpConfig,
        JSON.stringify({
          hypervisor: { guestImagePath: GUEST_IMAGE, firmware: { snpFirmwarePath: SNP_FIRMWARE } },
          handlers: {
            'lab-snp': {
              confidential: true,
              tee: { kind: 'snp' },
              vm: { hotplugVcpus: 0, hotplugMemoryMiB: 0, freePageReporting: false },
              pcie: { vfioPolicy: 'cold-plug', sparePorts: 0 },
            },
          },
        }),
      );
      const request = path.join(dir, 'snp-pod.json');
      const pod = {
        config: {
          metadata: { name: 'lab', namespace: 'default', uid: 'u1' },
          annotations: { 'io.kata-ts.initdata': annotation(INITDATA) },
        },
      };
      writeFileSync(request, JSON.stringify(pod));
      const plain = io();
      expect(
        await runPlanCommand(['--request', request, '--config', snpConfig, '--handler', 'lab-snp', '--format', 'json'], plain.io),
      ).toBe(0);
      const argv: string[] = JSON.parse(plain.out()).qemu.argv;
      const out = io();
      expect(
        await runPlanCommand(
          ['--measurements', '--request', request, '--config', snpConfig, '--handler', 'lab-snp', '--format', 'json'],
          out.io,
        ),
      ).toBe(0);
      const doc = checkReferenceValues(JSON.parse(out.out()));
      const flag = (f: string) => argv[argv.indexOf(f) + 1]!;
      const expected = snpMeasurement({
        firmware: readFileSync(SNP_FIRMWARE),
        vcpus: Number(/cpus=(\d+)/.exec(flag('-smp'))![1]),
        vcpuType: cpuSignatureFromCpuinfo(readFileSync(CPUINFO, 'utf8')),
        kernel: readFileSync(flag('-kernel')),
        initrd: readFileSync(flag('-initrd')),
        cmdline: flag('-append'),
        hostData: snpHostData(parseInitdataDocument(Buffer.from(INITDATA))),
        guestFeatures: 0x1,
      });
      expect(doc.tee).toBe('snp');
      expect(doc.snp).toEqual({ snp_launch_measurement: expected.launchDigest, host_data: expected.hostData });
      const text = io();
      expect(await runPlanCommand(['--measurements', '--request', request, '--config', snpConfig, '--handler', 'lab-snp'], text.io)).toBe(
        0,
      );
      expect(text.out()).toContain(expected.launchDigest);
    },
  );
});
