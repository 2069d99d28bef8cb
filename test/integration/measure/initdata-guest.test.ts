/**
 * The initdata binding in a real guest: kata-ts's guest (kernel, initramfs with guest/init and the
 * qemu_fw_cfg module, guest.img with the real agent, built by scripts/build-guest.sh into the
 * tests' agent-guest cache, never the installed guest) boots under QEMU 7.2 (TCG, q35) with Debian's OVMF,
 * a fresh swtpm behind tpm-crb and an initdata document as the fw_cfg file
 * opt/org.kata-ts/initdata, as src/hypervisor/argv.ts hands it over. The host then asks the agent,
 * over its virtio-serial channel, for GetTpmQuote with a fresh nonce: the quote verifies
 * (src/measure/quote.ts); its PCRs 4, 7, 8 and 9 equal the reference values predicted from the
 * very argv before the boot (src/measure/launch.ts, what `plan --measurements` prints), PCR 8
 * being exactly one extend of sha256 of the document (src/measure/initdata.ts), so the agent
 * measured the document before publishing it; a second boot with one byte of the document changed moves PCR 8
 * to its new prediction and leaves PCRs 4 and 9 alone. Two boots; QEMU and swtpm are ended by pid
 * (start time checked), the temporary directory removed, pass or fail.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { afterAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../../src/agent-client/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { isSameLiveProcess, readProcStat } from '../../../src/common/procfs.js';
import { INITDATA_FW_CFG_NAME } from '../../../src/hypervisor/argv.js';
import { KATA_INITDATA_ANNOTATION, parseInitdataAnnotation, vtpmPcr8 } from '../../../src/measure/initdata.js';
import { plannedVtpmReferenceValues } from '../../../src/measure/launch.js';
import { appraiseQuote, verifyQuote } from '../../../src/measure/quote.js';
import { agentGuestDir, agentServingEntry } from '../../helpers/agent-guest.js';
import { until, untilProgress } from '../../helpers/poll.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const QEMU = '/usr/bin/qemu-system-x86_64';
const SWTPM = '/usr/bin/swtpm';
const OVMF_CODE = '/usr/share/OVMF/OVMF_CODE_4M.fd';
const OVMF_VARS = '/usr/share/OVMF/OVMF_VARS_4M.fd';
const missing = [QEMU, SWTPM, OVMF_CODE, OVMF_VARS].filter((p) => !existsSync(p));
const GUEST_DIR = process.env.KATA_TS_INITDATA_GUEST_DIR ?? agentGuestDir();

/** A Kata-style document, as a pod would carry it in Kata's annotation. */
const DOC = `version = "0.1.0"
algorithm = "sha384"

[data]
"aa.toml" = '''
[token_configs.kbs]
url = "http://kbs.example:8080"
'''
"policy.rego" = '''
package agent_policy
default AllowRequestsFailingPolicy := false
'''
`;

interface Started {
  pid: number;
  startTimeTicks: number;
  child: ChildProcess;
}

describe.skipIf(missing.length > 0)('initdata measured by the real guest agent', () => {
  const started: Started[] = [];
  let dir = '';

  function track(child: ChildProcess, what: string): Started {
    const pid = child.pid;
    if (pid === undefined) throw new Error(`${what} did not start`);
    const entry = { pid, startTimeTicks: readProcStat(pid)?.startTimeTicks ?? -1, child };
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

  afterAll(async () => {
    for (const p of started.splice(0)) await stop(p);
    if (dir !== '') rmSync(dir, { recursive: true, force: true });
  });

  /** One boot with `doc` as the pod's initdata: the verified quote of PCRs 4, 8 and 9. */
  async function bootAndQuote(label: string, doc: Buffer): Promise<{ quoted: Record<number, string>; predicted: Record<string, string> }> {
    const work = path.join(dir, label);
    mkdirSync(path.join(work, 'tpm'), { recursive: true });
    writeFileSync(path.join(work, 'vars.fd'), readFileSync(OVMF_VARS));
    const docFile = path.join(work, 'initdata.toml');
    writeFileSync(docFile, doc);
    const tpmSock = path.join(work, 'swtpm.sock');
    const agentSock = path.join(work, 'agent.sock');
    const consoleLog = path.join(work, 'console.log');
    const swtpmLog = openSync(path.join(work, 'swtpm.err'), 'w');
    const swtpm = track(
      spawn(SWTPM, ['socket', '--tpm2', '--tpmstate', `dir=${path.join(work, 'tpm')}`, '--ctrl', `type=unixio,path=${tpmSock}`], {
        stdio: ['ignore', swtpmLog, swtpmLog],
      }),
      'swtpm',
    );
    await until('the swtpm control socket', async () => (existsSync(tpmSock) ? true : undefined), 20_000, 50);
    const argv = [
      ...['-machine', 'q35', '-accel', 'tcg', '-m', '1024', '-smp', '1', '-nodefaults', '-no-reboot'],
      ...['-display', 'none', '-monitor', 'none', '-serial', `file:${consoleLog}`],
      ...['-drive', `if=pflash,format=raw,unit=0,readonly=on,file=${OVMF_CODE}`],
      ...['-drive', `if=pflash,format=raw,unit=1,file=${path.join(work, 'vars.fd')}`],
      ...['-chardev', `socket,id=chrtpm,path=${tpmSock}`, '-tpmdev', 'emulator,id=tpm0,chardev=chrtpm', '-device', 'tpm-crb,tpmdev=tpm0'],
      ...['-kernel', path.join(GUEST_DIR, 'vmlinuz'), '-initrd', path.join(GUEST_DIR, 'initramfs.cpio.gz')],
      ...['-append', 'console=ttyS0 panic=-1'],
      ...['-drive', `if=none,id=img,file=${path.join(GUEST_DIR, 'guest.img')},format=raw,readonly=on`],
      ...['-device', 'virtio-blk-pci,drive=img,serial=kata-ts-guest'],
      ...['-device', 'virtio-serial-pci,id=vser'],
      ...['-chardev', `socket,id=agent,path=${agentSock},server=on,wait=off`],
      ...['-device', 'virtserialport,bus=vser.0,chardev=agent,name=org.kata-ts.agent'],
      ...['-fw_cfg', `name=${INITDATA_FW_CFG_NAME},file=${docFile}`],
    ];
    // The prediction, from the very argv the boot uses, before it boots (as plan --measurements does).
    const reference = plannedVtpmReferenceValues({
      argv,
      pod: { name: label, namespace: 'test', uid: label },
      handler: 'initdata-guest-test',
      ovmfVarsTemplatePath: OVMF_VARS,
      initdata: doc,
      read: (p) => readFileSync(p),
    });
    const predicted = reference.vtpm?.pcrs ?? {};
    expect(Object.keys(predicted).map(Number)).toEqual([4, 7, 8, 9]);
    const qemuErr = openSync(path.join(work, 'qemu.err'), 'w');
    const qemu = track(spawn(QEMU, argv, { stdio: ['ignore', qemuErr, qemuErr] }), 'qemu');
    const text = (): string => (existsSync(consoleLog) ? readFileSync(consoleLog, 'latin1') : '');
    // Wait on the guest's own progress (its console grows) until the agent announces itself.
    await untilProgress(
      `the ${label} guest's agent to serve`,
      async () => {
        const t = text();
        if (qemu.child.exitCode !== null || qemu.child.signalCode !== null)
          throw new Error(`QEMU exited: ${readFileSync(path.join(work, 'qemu.err'), 'utf8')}\n${t.slice(-2000)}`);
        return {
          done: t.includes('agent serving') ? true : undefined,
          progress: existsSync(consoleLog) ? statSync(consoleLog).size : 0,
          seen: t.slice(-300),
        };
      },
      90_000,
    );
    expect(text()).toContain('initdata measured into the TPM and published');
    // QEMU's default TCG vCPU (qemu64: no SSE4, no AVX) is the least a guest gets: the agent's V8
    // start-up snapshot, built on this host, still loads there, on the first start.
    if (process.arch === 'x64') {
      const agentLines = text()
        .split('\n')
        .filter((l) => /agent|snapshot|V8/.test(l))
        .slice(0, 20)
        .join('\n');
      expect(agentServingEntry(text()), agentLines).toMatchObject({ start: 1, codeSource: 'snapshot' });
    }
    const client = await AgentClient.connect({ socketPath: agentSock, logger: silentLogger(), hostVersion: 'test' }, 120_000);
    try {
      const nonce = randomBytes(32);
      const verified = verifyQuote(await client.tpmQuote(nonce, [4, 7, 8, 9], { timeoutMs: 120_000 }), nonce);
      expect(verified.pcrs).toEqual([4, 7, 8, 9]);
      // Every predicted PCR (kernel, Secure Boot state, initdata, command line and initrd) as quoted.
      expect(appraiseQuote(verified, predicted)).toEqual({ ok: true, matched: [4, 7, 8, 9], mismatched: [], notQuoted: [] });
      return { quoted: verified.pcrValues, predicted };
    } finally {
      client.close();
      await stop(qemu);
      await stop(swtpm);
    }
  }

  it('PCR 8 in the guest TPM quote equals the prediction from the annotation; one changed byte of the document changes PCR 8 only', async () => {
    // The guest with this checkout's agent and modules (idempotent: quick when nothing changed).
    execFileSync('bash', [path.join(repo, 'scripts/build-guest.sh'), '--out', GUEST_DIR], {
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    dir = mkdtempSync(path.join(os.tmpdir(), 'initdata-'));
    const first = parseInitdataAnnotation(gzipSync(DOC).toString('base64'), KATA_INITDATA_ANNOTATION);
    const second = parseInitdataAnnotation(gzipSync(DOC.replace('8080', '8081')).toString('base64'), KATA_INITDATA_ANNOTATION);
    const { quoted: a } = await bootAndQuote('first', first.document);
    expect(a[8]).toBe(vtpmPcr8(first).value.toString('hex'));
    const { quoted: b } = await bootAndQuote('second', second.document);
    expect(b[8]).toBe(vtpmPcr8(second).value.toString('hex'));
    expect(b[8]).not.toBe(a[8]);
    // Same kernel, initrd and command line: PCRs 4, 7 and 9 do not move.
    expect([b[4], b[7], b[9]]).toEqual([a[4], a[7], a[9]]);
  });
});
