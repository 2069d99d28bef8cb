/**
 * The guest image's dm-verity table on a TEE pod's command line: the metadata file beside
 * guest.img (read, bounded, every field checked with a code naming it), the kernel parameter
 * guest/init parses, the argv (a TEE VM's -append carries it; the default handler's argv is the
 * same with or without it) and the plan (a TEE pod without the metadata is planned unverified,
 * which RunPodSandbox refuses).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { buildPlanReport } from '../../../src/cli/plan/report.js';
import { buildQemuArgv, type QemuArgvSpec } from '../../../src/hypervisor/argv.js';
import {
  type GuestImageVerity,
  guestImageVerityDocument,
  parseGuestImageVerity,
  readGuestImageVerity,
  verityKernelParam,
} from '../../../src/hypervisor/guest-verity.js';
import { thrown } from '../../helpers/kata-error.js';
import { fixturePlanEnvironment } from '../../helpers/plan-env.js';

const VERITY: GuestImageVerity = { rootHash: 'a1'.repeat(32), salt: '5a'.repeat(32), dataBlocks: 23_456, hashStartBlock: 23_456 };
const PARAM = `kata_ts.verity=${'a1'.repeat(32)},${'5a'.repeat(32)},23456,23456`;
const dir = mkdtempSync(path.join(os.tmpdir(), 'guest-verity-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const flagValues = (argv: string[], flag: string): string[] =>
  argv.flatMap((a, i) => (a === flag && argv[i + 1] !== undefined ? [argv[i + 1]!] : []));
const appendOf = (argv: string[]): string => flagValues(argv, '-append')[0] ?? '';

describe('the verity metadata file', () => {
  it('round-trips through the document build-guest.sh writes, and becomes one kernel parameter', () => {
    const doc = guestImageVerityDocument(VERITY);
    expect(doc).toMatchObject({ schema: 'kata-ts/guest-image-verity/v1', version: 1, hashAlgorithm: 'sha256', dataBlockSize: 4096 });
    expect(parseGuestImageVerity(JSON.parse(JSON.stringify(doc)))).toEqual(VERITY);
    expect(verityKernelParam(VERITY)).toBe(PARAM);
  });

  it.each([
    ['schema', { schema: 'other' }],
    ['version', { version: 0 }],
    ['hashAlgorithm', { hashAlgorithm: 'sha1' }],
    ['dataBlockSize', { dataBlockSize: 512 }],
    ['hashBlockSize', { hashBlockSize: 1024 }],
    ['rootHash', { rootHash: 'A1'.repeat(32) }],
    ['rootHash', { rootHash: 'a1'.repeat(31) }],
    ['salt', { salt: '' }],
    ['salt', { salt: '5a,1 2' }],
    ['dataBlocks', { dataBlocks: 0 }],
    ['dataBlocks', { dataBlocks: 1.5 }],
    ['hashStartBlock', { hashStartBlock: 'x' }],
    ['hashStartBlock', { hashStartBlock: 100 }],
  ])('refuses a bad %s with GUEST_IMAGE_VERITY_INVALID naming it', (field, change) => {
    const err = thrown(() => parseGuestImageVerity({ ...guestImageVerityDocument(VERITY), ...change }));
    expect(err.reason).toBe('GUEST_IMAGE_VERITY_INVALID');
    expect(err.details?.field).toBe(field);
  });

  it('is read from <image>.verity.json: none is null, a valid one parsed, non-JSON and oversized ones refused', async () => {
    const image = path.join(dir, 'guest.img');
    expect(await readGuestImageVerity(image)).toBeNull();
    writeFileSync(`${image}.verity.json`, JSON.stringify(guestImageVerityDocument(VERITY)));
    expect(await readGuestImageVerity(image)).toEqual(VERITY);
    writeFileSync(`${image}.verity.json`, '{');
    expect((await readGuestImageVerity(image).catch((e: unknown) => e)) as Error).toMatchObject({ reason: 'GUEST_IMAGE_VERITY_INVALID' });
    writeFileSync(`${image}.verity.json`, ' '.repeat(5000));
    expect((await readGuestImageVerity(image).catch((e: unknown) => e)) as Error).toMatchObject({
      reason: 'GUEST_IMAGE_VERITY_INVALID',
      details: { field: 'document' },
    });
  });
});

/** The kata-ts-cvm shape with a vtpm TEE and a guest image. */
function cvm(): QemuArgvSpec {
  return {
    name: 'cvm-1',
    shape: { vcpus: 1, maxVcpus: 1, memoryMiB: 1024, maxMemoryMiB: 1024, hugepages: [], kernelParams: [] },
    accel: 'tcg',
    kernelPath: '/g/vmlinuz',
    initrdPath: '/g/initramfs.cpio.gz',
    kernelParams: ['loglevel=4'],
    paths: { qmpSocket: '/w/vmm/qmp.sock', readySocket: '/w/vmm/ready.sock', consoleLog: '/w/vmm/console.log' },
    pcieArgs: [],
    confidential: true,
    guestImagePath: '/g/guest.img',
    tee: { kind: 'vtpm', ovmfCodePath: '/o/CODE.fd', ovmfVarsPath: '/w/vmm/VARS.fd', tpmSocket: '/w/tpm/ctrl.sock' },
  };
}

describe('buildQemuArgv: the verity parameter', () => {
  it("a TEE VM's -append carries it, before the config's own parameters", () => {
    const append = appendOf(buildQemuArgv({ ...cvm(), guestImageVerity: VERITY }));
    expect(append.split(' ')).toContain(PARAM);
    expect(append.endsWith(`${PARAM} loglevel=4`)).toBe(true);
    expect(appendOf(buildQemuArgv(cvm()))).not.toContain('kata_ts.verity');
  });

  it('is refused without a TEE (nothing measures that command line) and without a guest image', () => {
    const { tee: _tee, ...noTee } = cvm();
    expect(thrown(() => buildQemuArgv({ ...noTee, guestImageVerity: VERITY })).reason).toBe('GUEST_IMAGE_VERITY_INVALID');
    expect(thrown(() => buildQemuArgv({ ...cvm(), tee: { kind: 'none' }, guestImageVerity: VERITY })).reason).toBe(
      'GUEST_IMAGE_VERITY_INVALID',
    );
    const { guestImagePath: _image, ...noImage } = cvm();
    expect(thrown(() => buildQemuArgv({ ...noImage, guestImageVerity: VERITY })).details?.field).toBe('guestImageVerity');
  });
});

describe('planning: the verity table as an input', () => {
  const request = (handler: string) => ({
    runtime_handler: handler,
    config: { metadata: { name: 'p', namespace: 'n', uid: 'u', attempt: 0 } },
  });
  const noTee = { host: { snp: { ok: false, message: 'none' }, tdx: { ok: false, message: 'none' } }, qemuVersion: null };

  it('kata-ts-cvm (vtpm here): the measured -append carries the root hash; the plan names the image and its table', async () => {
    const env = await fixturePlanEnvironment({ cpus: 8, memoryMiB: 16_384 });
    const report = buildPlanReport(request('kata-ts-cvm'), { ...env, tee: noTee, guestImageVerity: VERITY });
    expect(report.tee?.kind).toBe('vtpm');
    expect(appendOf(report.qemu.argv).split(' ')).toContain(PARAM);
    expect(report.tee?.guestImage).toEqual({ path: env.config.hypervisor.guestImagePath, verity: VERITY });
  });

  it('kata-ts-cvm without metadata: planned unverified (RunPodSandbox refuses it), no parameter', async () => {
    const env = await fixturePlanEnvironment({ cpus: 8, memoryMiB: 16_384 });
    const report = buildPlanReport(request('kata-ts-cvm'), { ...env, tee: noTee, guestImageVerity: null });
    expect(report.tee?.guestImage).toEqual({ path: env.config.hypervisor.guestImagePath, verity: null });
    expect(appendOf(report.qemu.argv)).not.toContain('kata_ts.verity');
  });

  it('the default handler: the same argv whether the image has a verity table or not, and no parameter', async () => {
    const env = await fixturePlanEnvironment({ cpus: 8, memoryMiB: 16_384 });
    const withTable = buildPlanReport(request('kata-ts'), { ...env, tee: noTee, guestImageVerity: VERITY });
    const without = buildPlanReport(request('kata-ts'), { ...env, tee: noTee });
    expect(withTable.qemu.argv).toEqual(without.qemu.argv);
    expect(appendOf(withTable.qemu.argv)).not.toContain('kata_ts.verity');
    expect(withTable.tee).toMatchObject({ kind: 'none', guestImage: null });
  });
});
