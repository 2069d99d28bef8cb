/**
 * Records real QMP conversations with the installed QEMU into fixtures/qmp/*.qmp, the transcripts
 * the QMP client's unit tests replay. Run by hand when QEMU changes:
 *
 *     npx tsx test/helpers/hypervisor-qmp-record.ts [scenario...]
 *
 * Transcript format (one message per line, in wire order):
 *     # comment
 *     -> {"execute": ...}      what the client sent
 *     <- {"return": ...}       what QEMU sent (replies and events, exactly as received)
 *     <- CLOSE                 QEMU closed the connection
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const fixtureDir = path.resolve(here, '../../fixtures/qmp');

interface Step {
  execute: string;
  arguments?: Record<string, unknown>;
  /** Extra time to collect events that follow the reply. */
  settleMs?: number;
}

interface Scenario {
  name: string;
  comment: string;
  qemuArgs: string[];
  steps: Step[];
}

async function record(scenario: Scenario): Promise<void> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'qmp-rec-'));
  const sock = path.join(dir, 'qmp.sock');
  const qemu = spawn(
    'qemu-system-x86_64',
    [
      '-machine',
      'q35',
      '-accel',
      'tcg',
      '-nodefaults',
      '-display',
      'none',
      '-S',
      '-qmp',
      `unix:${sock},server=on,wait=off`,
      ...scenario.qemuArgs,
    ],
    { stdio: ['ignore', 'inherit', 'inherit'] },
  );
  const lines: string[] = [`# ${scenario.comment}`, `# recorded from ${await qemuVersion()}`];
  try {
    for (let i = 0; i < 100 && !existsSync(sock); i++) await sleep(50);
    const socket = net.createConnection(sock);
    let buffer = '';
    let closed = false;
    const waiters: Array<() => void> = [];
    const received: Array<Record<string, unknown>> = [];
    socket.on('data', (chunk) => {
      buffer += chunk.toString('utf8');
      let nl = buffer.indexOf('\n');
      while (nl >= 0) {
        const line = buffer.slice(0, nl).trim();
        buffer = buffer.slice(nl + 1);
        if (line !== '') {
          lines.push(`<- ${line}`);
          received.push(JSON.parse(line) as Record<string, unknown>);
          for (const w of waiters.splice(0)) w();
        }
        nl = buffer.indexOf('\n');
      }
    });
    socket.on('error', (err) => lines.push(`# socket error: ${err.message}`));
    socket.on('close', () => {
      closed = true;
      lines.push('<- CLOSE');
      for (const w of waiters.splice(0)) w();
    });
    const until = async (pred: () => boolean): Promise<void> => {
      while (!pred() && !closed) await new Promise<void>((r) => waiters.push(r));
    };
    await until(() => received.some((m) => 'QMP' in m));
    const all: Step[] = [{ execute: 'qmp_capabilities' }, ...scenario.steps];
    for (const [index, step] of all.entries()) {
      const id = index + 1;
      const msg: Record<string, unknown> = { execute: step.execute };
      if (step.arguments !== undefined) msg.arguments = step.arguments;
      msg.id = id;
      const text = JSON.stringify(msg);
      lines.push(`-> ${text}`);
      socket.write(`${text}\n`);
      await until(() => received.some((m) => m.id === id));
      if (step.settleMs !== undefined) await sleep(step.settleMs);
    }
    await until(() => closed);
  } finally {
    if (qemu.exitCode === null && qemu.pid !== undefined) process.kill(qemu.pid, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
  writeFileSync(path.join(fixtureDir, `${scenario.name}.qmp`), `${lines.join('\n')}\n`);
  console.log(`wrote ${scenario.name}.qmp (${lines.length} lines)`);
}

async function qemuVersion(): Promise<string> {
  const child = spawn('qemu-system-x86_64', ['--version']);
  let out = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  await new Promise((r) => child.on('close', r));
  return out.split('\n')[0] ?? 'qemu';
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

const scenarios: Scenario[] = [
  {
    name: 'lifecycle',
    comment: 'paused start (-S), status, cont/stop with RESUME/STOP events, quit with SHUTDOWN and close',
    qemuArgs: ['-m', '256'],
    steps: [
      { execute: 'query-status' },
      { execute: 'cont', settleMs: 200 },
      { execute: 'query-status' },
      { execute: 'stop', settleMs: 200 },
      { execute: 'query-status' },
      { execute: 'quit', settleMs: 500 },
    ],
  },
  {
    name: 'queries',
    comment: 'sizes and topology: -smp 2,maxcpus=4 and a virtio-mem device (0 plugged) on pcie.0',
    qemuArgs: [
      '-smp',
      '2,maxcpus=4',
      '-m',
      '256,maxmem=1280M',
      '-object',
      'memory-backend-ram,id=vmem0-mem,size=1024M',
      '-device',
      'virtio-mem-pci,id=vmem0,memdev=vmem0-mem,requested-size=0,bus=pcie.0,addr=0x3',
    ],
    steps: [
      { execute: 'query-cpus-fast' },
      { execute: 'query-hotpluggable-cpus' },
      { execute: 'query-memory-size-summary' },
      { execute: 'query-pci' },
      { execute: 'qom-get', arguments: { path: '/machine/peripheral/vmem0', property: 'requested-size' } },
      { execute: 'qom-set', arguments: { path: '/machine/peripheral/vmem0', property: 'requested-size', value: 268435456 } },
      { execute: 'qom-get', arguments: { path: '/machine/peripheral/vmem0', property: 'requested-size' } },
      { execute: 'quit', settleMs: 500 },
    ],
  },
  {
    name: 'hotplug',
    comment: 'CPU hot-plug by device_add, object-add, a virtio-serial port added and removed (DEVICE_DELETED at once)',
    qemuArgs: ['-smp', '1,maxcpus=2', '-m', '256', '-device', 'virtio-serial-pci,id=vser0,bus=pcie.0,addr=0x2'],
    steps: [
      { execute: 'query-hotpluggable-cpus' },
      {
        execute: 'device_add',
        arguments: { driver: 'qemu64-x86_64-cpu', id: 'cpu-1', 'socket-id': 0, 'core-id': 1, 'thread-id': 0 },
      },
      { execute: 'query-cpus-fast' },
      { execute: 'object-add', arguments: { 'qom-type': 'memory-backend-ram', id: 'mem-extra', size: 134217728 } },
      { execute: 'device_add', arguments: { driver: 'virtserialport', id: 'port-x', bus: 'vser0.0', name: 'org.example.x' } },
      { execute: 'device_del', arguments: { id: 'port-x' }, settleMs: 300 },
      { execute: 'quit', settleMs: 500 },
    ],
  },
  {
    name: 'resize',
    comment: 'what src/hypervisor/resize.ts sends: plug two vCPUs into free slots, a full slot list, virtio-mem requested-size',
    qemuArgs: [
      '-cpu',
      'max',
      '-smp',
      'cpus=2,maxcpus=4,sockets=1,cores=4,threads=1',
      '-m',
      'size=256M,maxmem=1280M',
      '-object',
      'memory-backend-ram,id=vmem0-mem,size=1024M',
      '-device',
      'virtio-mem-pci,id=vmem0,memdev=vmem0-mem,requested-size=0,bus=pcie.0,addr=03.0',
    ],
    steps: [
      { execute: 'query-hotpluggable-cpus' },
      {
        execute: 'device_add',
        arguments: { driver: 'max-x86_64-cpu', id: 'vcpu-s0-c2-t0', 'core-id': 2, 'thread-id': 0, 'node-id': 0, 'socket-id': 0 },
      },
      {
        execute: 'device_add',
        arguments: { driver: 'max-x86_64-cpu', id: 'vcpu-s0-c3-t0', 'core-id': 3, 'thread-id': 0, 'node-id': 0, 'socket-id': 0 },
      },
      { execute: 'query-hotpluggable-cpus' },
      { execute: 'qom-set', arguments: { path: '/machine/peripheral/vmem0', property: 'requested-size', value: 268435456 } },
      { execute: 'qom-get', arguments: { path: '/machine/peripheral/vmem0', property: 'size' } },
      { execute: 'quit', settleMs: 500 },
    ],
  },
  {
    name: 'errors',
    comment: 'QEMU error replies: GenericError, DeviceNotFound, CommandNotFound, bad arguments',
    qemuArgs: ['-m', '256'],
    steps: [
      { execute: 'device_add', arguments: { driver: 'no-such-driver', id: 'x' } },
      { execute: 'device_del', arguments: { id: 'missing-device' } },
      { execute: 'no-such-command' },
      { execute: 'qom-get', arguments: { path: '/machine', property: 'no-such-property' } },
      { execute: 'object-add', arguments: { 'qom-type': 'memory-backend-ram', id: 'm' } },
      { execute: 'quit', settleMs: 500 },
    ],
  },
];

const wanted = process.argv.slice(2);
for (const scenario of scenarios) if (wanted.length === 0 || wanted.includes(scenario.name)) await record(scenario);
