/**
 * The vTPM prediction against the real thing: QEMU 7.2 (TCG, q35) with Debian's OVMF, a fresh
 * swtpm behind tpm-crb and direct kernel boot of kata-ts's guest kernel with a tiny initrd this
 * test builds. The guest prints its PCRs 0-9 and its firmware event log on the serial console and
 * powers off. Checked:
 *  - the printed PCRs 4, 7, 8 and 9 equal the values predicted before the boot from the very argv
 *    the boot uses (src/measure/launch.ts, as `plan --measurements` predicts them), and the event
 *    log's PCR 4, 7 and 9 entries equal the predicted events one by one;
 *  - changing one byte of the command line, adding one byte to the initrd and changing one byte of
 *    the kernel (a hashed PE header field the boot does not use) changes exactly the PCRs the
 *    prediction says change, among PCRs 0-9, to the predicted values.
 * PCR 8: the test's /init extends it once with sha256 of an "initdata" document, as the guest
 * does (one raw TPM2_PCR_Extend written to /dev/tpm0), so the initdata path is predicted too.
 * Four boots; swtpm and QEMU are ended by pid, the temporary directory removed, pass or fail.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSameLiveProcess, readProcStat } from '../../../src/common/procfs.js';
import { plannedVtpmReferenceValues } from '../../../src/measure/launch.js';
import { type PcrEvent, replayPcrs, sha256 } from '../../../src/measure/pcr.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { until, untilProgress } from '../../helpers/poll.js';

const QEMU = '/usr/bin/qemu-system-x86_64';
const SWTPM = '/usr/bin/swtpm';
const BUSYBOX = '/bin/busybox';
const OVMF_CODE = '/usr/share/OVMF/OVMF_CODE_4M.fd';
const OVMF_VARS = '/usr/share/OVMF/OVMF_VARS_4M.fd';
const MEMORY_MIB = 512;
const PCRS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
const PREDICTED = [4, 7, 8, 9];
const INITDATA = Buffer.from('algorithm = "sha256"\nversion = "0.1.0"\n[data]\n"policy.rego" = "package agent_policy"\n');

const missing = [QEMU, SWTPM, BUSYBOX, OVMF_CODE, OVMF_VARS, '/usr/bin/cpio'].filter((p) => !existsSync(p));

interface Started {
  pid: number;
  startTimeTicks: number;
  child: ChildProcess;
}

interface BootInput {
  label: string;
  kernel: string;
  initrd: string;
  cmdline: string;
}

interface Prediction {
  pcrs: Record<string, string>;
  events: PcrEvent[];
}

interface BootResult {
  pcrs: Record<number, string>;
  log: LogEvent[];
}

interface LogEvent {
  pcr: number;
  type: string;
  digestSha256: string;
}

const EVENT_TYPES: Record<number, string> = {
  3: 'EV_NO_ACTION',
  4: 'EV_SEPARATOR',
  6: 'EV_EVENT_TAG',
  2147483649: 'EV_EFI_VARIABLE_DRIVER_CONFIG',
  2147483651: 'EV_EFI_BOOT_SERVICES_APPLICATION',
  2147483655: 'EV_EFI_ACTION',
};

/**
 * The sha256 digests of a TCG2 crypto-agile event log (what the guest's securityfs shows): a
 * SHA-1-format header event whose Spec ID event lists the banks and their digest sizes, then
 * events with one digest per bank. Bounded reads: this is guest output.
 */
function parseEventLog(log: Buffer): LogEvent[] {
  const need = (at: number, n: number): void => {
    if (at + n > log.length) throw new Error(`event log truncated at ${at}`);
  };
  need(0, 32);
  const headerSize = log.readUInt32LE(28);
  need(32, headerSize);
  const spec = 32;
  if (log.subarray(spec, spec + 15).toString('latin1') !== 'Spec ID Event03') throw new Error('not a crypto-agile event log');
  const algorithms = log.readUInt32LE(spec + 24);
  const sizes = new Map<number, number>();
  for (let i = 0; i < algorithms; i++) sizes.set(log.readUInt16LE(spec + 28 + i * 4), log.readUInt16LE(spec + 30 + i * 4));
  const out: LogEvent[] = [];
  let at = 32 + headerSize;
  while (at + 12 <= log.length) {
    const pcr = log.readUInt32LE(at);
    const type = log.readUInt32LE(at + 4);
    const count = log.readUInt32LE(at + 8);
    at += 12;
    let digest = '';
    for (let i = 0; i < count; i++) {
      need(at, 2);
      const alg = log.readUInt16LE(at);
      const size = sizes.get(alg);
      if (size === undefined) throw new Error(`event log names an unknown algorithm 0x${alg.toString(16)}`);
      need(at + 2, size);
      if (alg === 0x000b) digest = log.subarray(at + 2, at + 2 + size).toString('hex');
      at += 2 + size;
    }
    need(at, 4);
    at += 4 + log.readUInt32LE(at);
    out.push({ pcr, type: EVENT_TYPES[type] ?? `0x${type.toString(16)}`, digestSha256: digest });
  }
  return out;
}

/** One TPM2_PCR_Extend of PCR 8 (password session, sha256 bank) as bytes for busybox printf. */
function pcr8ExtendCommand(digest: Buffer): string {
  const body = Buffer.concat([
    Buffer.from([0x00, 0x00, 0x00, 0x08]), // PCR 8
    Buffer.from([0x00, 0x00, 0x00, 0x09, 0x40, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x00, 0x00]), // TPM_RS_PW, empty auth
    Buffer.from([0x00, 0x00, 0x00, 0x01, 0x00, 0x0b]), // one digest, sha256
    digest,
  ]);
  const header = Buffer.alloc(10);
  header.writeUInt16BE(0x8002, 0); // TPM_ST_SESSIONS
  header.writeUInt32BE(10 + body.length, 2);
  header.writeUInt32BE(0x00000182, 6); // TPM_CC_PCR_Extend
  return [...Buffer.concat([header, body])].map((b) => `\\x${b.toString(16).padStart(2, '0')}`).join('');
}

const INIT = `#!/bin/busybox sh
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t securityfs securityfs /sys/kernel/security
/bin/busybox mount -t devtmpfs devtmpfs /dev
exec 3<>/dev/tpm0
/bin/busybox printf '${pcr8ExtendCommand(sha256(INITDATA))}' >&3
echo "EXTEND-RESPONSE=$(/bin/busybox dd bs=64 count=1 <&3 2>/dev/null | /bin/busybox od -An -tx1 | /bin/busybox tr -d ' \\n')"
exec 3>&-
for p in ${PCRS.join(' ')}; do echo "PCR$p=$(/bin/busybox cat /sys/class/tpm/tpm0/pcr-sha256/$p)"; done
echo EVLOG-BEGIN
/bin/busybox base64 /sys/kernel/security/tpm0/binary_bios_measurements
echo EVLOG-END
/bin/busybox poweroff -f
`;

/** A newc cpio with /init, busybox and the mount points /init needs. */
function buildInitrd(dir: string, out: string): void {
  const root = path.join(dir, 'initrd-root');
  for (const d of ['bin', 'dev', 'proc', 'sys']) mkdirSync(path.join(root, d), { recursive: true });
  writeFileSync(path.join(root, 'init'), INIT, { mode: 0o755 });
  writeFileSync(path.join(root, 'bin', 'busybox'), readFileSync(BUSYBOX), { mode: 0o755 });
  const list = ['.', 'bin', 'bin/busybox', 'dev', 'proc', 'sys', 'init'].join('\n');
  writeFileSync(out, execFileSync('cpio', ['-o', '-H', 'newc', '--quiet'], { cwd: root, input: list, maxBuffer: 64 * 1024 * 1024 }));
}

describe.skipIf(missing.length > 0)('vtpm prediction against a live OVMF + swtpm boot', () => {
  const started: Started[] = [];
  let dir = '';
  let kernel = '';
  let initrd = '';
  const cmdline = 'console=ttyS0 quiet panic=-1';

  function track(child: ChildProcess, what: string): Started {
    const pid = child.pid;
    if (pid === undefined) throw new Error(`${what} did not start`);
    const stat = readProcStat(pid);
    const entry = { pid, startTimeTicks: stat?.startTimeTicks ?? -1, child };
    started.push(entry);
    return entry;
  }

  async function stop(p: Started): Promise<void> {
    if (p.startTimeTicks >= 0 && isSameLiveProcess(p.pid, p.startTimeTicks)) {
      try {
        process.kill(p.pid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
    }
    await until(
      `pid ${p.pid} to exit`,
      async () => (p.child.exitCode !== null || p.child.signalCode !== null ? true : undefined),
      10_000,
      50,
    );
  }

  /** The argv of one boot: the same array is predicted from and started. */
  function qemuArgv(input: BootInput): string[] {
    const work = path.join(dir, input.label);
    return [
      ...['-machine', 'q35', '-accel', 'tcg', '-m', String(MEMORY_MIB), '-smp', '1', '-nodefaults', '-no-reboot'],
      ...['-display', 'none', '-monitor', 'none', '-serial', `file:${path.join(work, 'serial.log')}`],
      ...['-drive', `if=pflash,format=raw,unit=0,readonly=on,file=${OVMF_CODE}`],
      ...['-drive', `if=pflash,format=raw,unit=1,file=${path.join(work, 'vars.fd')}`],
      ...['-chardev', `socket,id=chrtpm,path=${path.join(work, 'swtpm.sock')}`],
      ...['-tpmdev', 'emulator,id=tpm0,chardev=chrtpm', '-device', 'tpm-crb,tpmdev=tpm0'],
      ...['-kernel', input.kernel, '-initrd', input.initrd, '-append', input.cmdline],
    ];
  }

  /** The prediction, made before the boot from the argv the boot will use (as `plan --measurements` does). */
  function predict(input: BootInput): Prediction {
    const doc = plannedVtpmReferenceValues({
      argv: qemuArgv(input),
      pod: { name: input.label, namespace: 'test', uid: input.label },
      handler: 'vtpm-predict-test',
      ovmfVarsTemplatePath: OVMF_VARS,
      initdata: INITDATA,
      read: (p) => readFileSync(p),
    });
    if (doc.vtpm === undefined) throw new Error('no vtpm section in the reference values');
    return { pcrs: doc.vtpm.pcrs, events: doc.vtpm.events };
  }

  /** Boots once with a fresh TPM and a fresh copy of the vars; returns what the guest printed. */
  async function boot(input: BootInput): Promise<BootResult> {
    const work = path.join(dir, input.label);
    mkdirSync(path.join(work, 'tpm'), { recursive: true });
    const vars = path.join(work, 'vars.fd');
    writeFileSync(vars, readFileSync(OVMF_VARS));
    const sock = path.join(work, 'swtpm.sock');
    const serial = path.join(work, 'serial.log');
    const swtpmLog = openSync(path.join(work, 'swtpm.err'), 'w');
    const swtpm = track(
      spawn(SWTPM, ['socket', '--tpm2', '--tpmstate', `dir=${path.join(work, 'tpm')}`, '--ctrl', `type=unixio,path=${sock}`], {
        stdio: ['ignore', swtpmLog, swtpmLog],
      }),
      'swtpm',
    );
    await until('the swtpm control socket', async () => (existsSync(sock) ? true : undefined), 20_000, 50);
    const qemuErr = openSync(path.join(work, 'qemu.err'), 'w');
    const qemu = track(spawn(QEMU, qemuArgv(input), { stdio: ['ignore', qemuErr, qemuErr] }), 'qemu');
    const text = (): string => (existsSync(serial) ? readFileSync(serial, 'latin1').replace(/\r/g, '') : '');
    const output = await untilProgress(`the ${input.label} guest to print its PCRs and event log`, async () => {
      const t = text();
      const exited = qemu.child.exitCode !== null || qemu.child.signalCode !== null;
      if (exited && !t.includes('EVLOG-END'))
        throw new Error(`QEMU exited before the guest finished: ${readFileSync(path.join(work, 'qemu.err'), 'utf8')}\n${t.slice(-2000)}`);
      return {
        done: t.includes('EVLOG-END') ? t : undefined,
        progress: existsSync(serial) ? statSync(serial).size : 0,
        seen: t.slice(-300),
      };
    });
    await stop(qemu);
    await stop(swtpm);
    const pcrs: Record<number, string> = {};
    for (const m of output.matchAll(/^PCR(\d+)=([0-9A-Fa-f]{64})$/gm)) pcrs[Number(m[1])] = (m[2] ?? '').toLowerCase();
    expect(Object.keys(pcrs).map(Number), `${input.label}: the guest printed every PCR`).toEqual(PCRS);
    // The guest's PCR 8 extension answered TPM_RC_SUCCESS (response code at bytes 6-9).
    const response = /^EXTEND-RESPONSE=([0-9a-f]*)$/m.exec(output)?.[1] ?? '';
    expect(response.slice(12, 20), `${input.label}: TPM2_PCR_Extend response ${response}`).toBe('00000000');
    const b64 = /EVLOG-BEGIN\n([\s\S]*?)EVLOG-END/.exec(output)?.[1] ?? '';
    return { pcrs, log: parseEventLog(Buffer.from(b64.replace(/\s+/g, ''), 'base64')) };
  }

  /** PCRs whose values differ between two sets. */
  const changed = (a: Record<string, string>, b: Record<string, string>, among: number[]): number[] => among.filter((p) => a[p] !== b[p]);

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'vtpm-'));
    kernel = (await ensureGuestAssets()).kernelPath;
    initrd = path.join(dir, 'initrd.cpio');
    buildInitrd(dir, initrd);
  });

  afterAll(async () => {
    for (const p of started.splice(0)) await stop(p);
    if (dir !== '') rmSync(dir, { recursive: true, force: true });
  });

  it('predicts PCRs 4, 7, 8 and 9 and their events; one byte of the cmdline, initrd or kernel changes exactly the predicted PCRs', async () => {
    const base: BootInput = { label: 'base', kernel, initrd, cmdline };
    const expected = predict(base);
    const live = await boot(base);
    for (const p of PREDICTED) expect(live.pcrs[p], `PCR ${p}`).toBe(expected.pcrs[p]);
    // The firmware's log, PCR by PCR, is the predicted event sequence (PCR 8 has no log entry: the guest extends it directly).
    for (const p of [4, 7, 9]) {
      const logged = live.log.filter((e) => e.pcr === p).map((e) => `${e.type} ${e.digestSha256}`);
      const predicted = expected.events.filter((e) => e.pcr === p).map((e) => `${e.type} ${e.digestSha256}`);
      expect(logged, `PCR ${p} events`).toEqual(predicted);
    }
    // And the log replays to what the TPM holds, so the comparison above is of the right log.
    expect(
      replayPcrs(
        live.log.filter((e) => e.type !== 'EV_NO_ACTION').map((e) => ({ ...e, description: '' })),
        [0, 1, 2, 3, 4, 5, 6, 7, 9],
      ),
    ).toEqual(Object.fromEntries([0, 1, 2, 3, 4, 5, 6, 7, 9].map((p) => [p, live.pcrs[p]])));

    // One byte of the command line.
    const cmdlineVariant: BootInput = { ...base, label: 'cmdline', cmdline: cmdline.replace('panic=-1', 'panic=-2') };
    // One byte more in the initrd: a zero after the archive's trailer, which the kernel skips.
    const initrd2 = path.join(dir, 'initrd-plus-one.cpio');
    writeFileSync(initrd2, Buffer.concat([readFileSync(initrd), Buffer.alloc(1)]));
    const initrdVariant: BootInput = { ...base, label: 'initrd', initrd: initrd2 };
    // One byte of the kernel: the COFF header's TimeDateStamp, hashed by Authenticode, read by nobody at boot.
    const kernelBytes = Buffer.from(readFileSync(kernel));
    const timeDateStamp = kernelBytes.readUInt32LE(0x3c) + 8;
    kernelBytes[timeDateStamp] = (kernelBytes[timeDateStamp] ?? 0) ^ 0x01;
    const kernel2 = path.join(dir, 'vmlinuz-one-byte');
    writeFileSync(kernel2, kernelBytes);
    const kernelVariant: BootInput = { ...base, label: 'kernel', kernel: kernel2 };

    const expectedChanges: Record<string, number[]> = {};
    for (const variant of [cmdlineVariant, initrdVariant, kernelVariant]) {
      const prediction = predict(variant);
      const predictedChange = changed(expected.pcrs, prediction.pcrs, PREDICTED);
      expectedChanges[variant.label] = predictedChange;
      const observed = await boot(variant);
      expect(changed(live.pcrs, observed.pcrs, PCRS), `${variant.label}: the PCRs that changed`).toEqual(predictedChange);
      for (const p of PREDICTED) expect(observed.pcrs[p], `${variant.label}: PCR ${p}`).toBe(prediction.pcrs[p]);
    }
    // What the prediction said, for the record: the observation, now computed.
    expect(expectedChanges).toEqual({ cmdline: [9], initrd: [4, 9], kernel: [4] });
  });
});
