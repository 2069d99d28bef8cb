/** The soak's faults, one function per kind, each followed by the invariants (see bench/soak.ts). */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { status } from '@grpc/grpc-js';
import { errnoCode } from '../../src/common/errors.js';
import { startProxy } from '../../test/helpers/images-proxy.js';
import { podConfig } from '../../test/helpers/runtime-daemon.js';
import { checkInvariants, stateSummary } from './soak-checks.js';
import {
  call,
  type FaultKind,
  type Pod,
  podProcesses,
  portOf,
  type Soak,
  signal,
  sleep,
  startContainer,
  violate,
  within,
} from './soak-context.js';

/** Inject one fault of `kind` into `pod` (a READY one), then check the invariants. */
export async function injectFault(soak: Soak, kind: FaultKind, pod: Pod): Promise<void> {
  const { result } = soak;
  result.faults++;
  result.faultKinds[kind]++;
  soak.progress(`fault ${result.faults}: ${kind} (pod ${pod.id.slice(0, 12)}) after ${result.requests} requests`);
  await FAULTS[kind](soak, pod);
  await checkInvariants(soak, `after ${kind} #${result.faultKinds[kind]}`);
}

const FAULTS: Record<FaultKind, (soak: Soak, pod: Pod) => Promise<void>> = {
  'daemon-kill': daemonKill,
  'qemu-kill': qemuKill,
  'virtiofsd-kill': virtiofsdKill,
  'guest-hang': guestHang,
  'agent-kill': agentKill,
  'registry-drop': registryDrop,
  'disk-full': diskFull,
};

async function daemonKill(soak: Soak): Promise<void> {
  process.kill(soak.rt.pid(), 'SIGKILL');
  await soak.rt.stop();
  await soak.rt.start();
}

/** A killed QEMU must turn its sandbox NOTREADY within 10 s; the time it takes is recorded. */
async function qemuKill(soak: Soak, pod: Pod): Promise<void> {
  const { pid } = await podProcesses(soak, pod);
  const t0 = performance.now();
  signal(pid, 'SIGKILL');
  for (;;) {
    const st = await call(soak, soak.rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: pod.id }));
    if (st.status?.state === 'SANDBOX_NOTREADY') {
      soak.result.notReadyMs.push(performance.now() - t0);
      return;
    }
    if (performance.now() - t0 > 10_000) {
      violate(soak, `qemu-kill: sandbox ${pod.id.slice(0, 12)} still READY 10 s after its QEMU was killed`);
      return;
    }
    await sleep(20);
  }
}

async function virtiofsdKill(soak: Soak, pod: Pod): Promise<void> {
  const { virtiofsd } = await podProcesses(soak, pod);
  signal(virtiofsd?.pid, 'SIGKILL');
  // The daemon notices within its watch period and ends the VM: the sandbox goes NOTREADY.
  await sleep(2_000);
}

/**
 * The guest stops answering (its QEMU SIGSTOPped for about 3 s: QMP `stop` cannot be sent from
 * outside, the daemon holds QEMU's one QMP connection). The daemon must keep answering, within
 * deadlines, meanwhile.
 */
async function guestHang(soak: Soak, pod: Pod): Promise<void> {
  const { pid } = await podProcesses(soak, pod);
  signal(pid, 'SIGSTOP');
  try {
    const t0 = Date.now();
    await call(soak, soak.rt.cri.runtime.ExecSync({ container_id: pod.ticker, cmd: ['true'], timeout: 2 }, within(8_000))).catch(
      () => undefined,
    );
    await call(soak, soak.rt.cri.runtime.Version({}, within(2_000))).catch((err: Error) =>
      violate(soak, `guest-hang: Version did not answer: ${err.message}`),
    );
    if (Date.now() - t0 > 9_000) violate(soak, 'guest-hang: an rpc outlived its deadline');
    await sleep(Math.max(0, 3_000 - (Date.now() - t0)));
  } finally {
    signal(pid, 'SIGCONT');
  }
  await sleep(1_000);
}

/**
 * From a container in the guest's root PID namespace (pid NODE): SIGKILL the agent; the guest's
 * init restarts it and the daemon's session reconnects. The ticker's log must stay whole (checked
 * with the invariants) and the pod usable again within a minute.
 */
async function agentKill(soak: Soak, pod: Pod): Promise<void> {
  const killer = await startContainer(
    soak,
    pod,
    `agent-killer${soak.seq.container++}`,
    [
      'sh',
      '-c',
      'cd /proc; for p in [0-9]*; do if grep -q "kata-ts/agent[.]" $p/cmdline 2>/dev/null; then kill -9 $p; fi; done; sleep 1000',
    ],
    { pid: 'NODE' },
  );
  const t0 = Date.now();
  for (;;) {
    const ok = await call(
      soak,
      soak.rt.cri.runtime.ExecSync({ container_id: pod.ticker, cmd: ['true'], timeout: 10 }, within(15_000)),
    ).then(
      () => true,
      () => false,
    );
    if (ok && Date.now() - t0 > 1_000) break;
    if (Date.now() - t0 > 60_000) {
      violate(soak, `agent-kill: the pod ${pod.id.slice(0, 12)} did not answer ExecSync within 60 s of its agent's SIGKILL`);
      break;
    }
    await sleep(500);
  }
  await call(soak, soak.rt.cri.runtime.StopContainer({ container_id: killer, timeout: 0 })).catch((err: Error) =>
    violate(soak, `agent-kill: the killer container cannot be stopped: ${err.message}`),
  );
  await call(soak, soak.rt.cri.runtime.RemoveContainer({ container_id: killer })).catch((err: Error) =>
    violate(soak, `agent-kill: the killer container cannot be removed: ${err.message}`),
  );
}

/**
 * A registry that breaks every blob transfer off: the pull fails as UNAVAILABLE (worth a retry),
 * within its deadline, and leaves no partial file in the store.
 */
async function registryDrop(soak: Soak): Promise<void> {
  const { registry, node, rt } = soak;
  const proxy = await startProxy(registry.url, { dropBlobs: { afterBytes: 4096 } });
  const stopRelay = await node?.relayLoopbackPort(portOf(proxy.host));
  try {
    const ref = soak.images.unpullable.replace(registry.host, proxy.host);
    const err = await call(soak, soak.rt.cri.image.PullImage({ image: { image: ref } }, within(60_000))).then(
      () => undefined,
      (e: { code?: number; message: string }) => e,
    );
    if (err === undefined) violate(soak, 'registry-drop: a pull through a registry that drops connections succeeded');
    else if (err.code !== status.UNAVAILABLE) violate(soak, `registry-drop: the pull failed with ${err.message}, not UNAVAILABLE`);
    const left = await fsp.readdir(path.join(rt.stateDir, 'images', 'ingest')).catch(() => []);
    if (left.length > 0) violate(soak, `registry-drop: ${left.length} partial files left in the image store`);
  } finally {
    await stopRelay?.();
    await proxy.stop();
  }
}

/**
 * The state disk full to the last page: reads keep answering (an exec included); a new pod, a
 * new container and a pull are refused as RESOURCE_EXHAUSTED and leave nothing behind; the
 * daemon restarts on the full disk and finds every pod and container again. Then the space is
 * given back and the invariants (a container starts in every READY pod) are checked.
 */
async function diskFull(soak: Soak, pod: Pod): Promise<void> {
  const { rt } = soak;
  // The node's disk as a whole: the runtime's state and the kubelet's pod logs both full.
  const ballasts = [path.join(rt.stateDir, 'soak-ballast'), path.join(soak.logDisk, 'soak-ballast')];
  const filledBytes = [await fillDisk(ballasts[0]!), await fillDisk(ballasts[1]!)];
  soak.progress(`  state and log disks filled with ${filledBytes.map((b) => (b / 2 ** 20).toFixed(1)).join(' + ')} MiB of ballast`);
  try {
    const before = await stateSummary(soak);
    await readsOnFullDisk(soak, pod);
    await refusalsOnFullDisk(soak, pod);
    const afterRefusals = await stateSummary(soak);
    if (afterRefusals !== before) violate(soak, `disk-full: refused requests changed the state: ${before} -> ${afterRefusals}`);
    process.kill(rt.pid(), 'SIGKILL');
    await rt.stop();
    await rt.start().catch((err: Error) => violate(soak, `disk-full: the daemon does not start on a full state disk: ${err.message}`));
    const afterRestart = await stateSummary(soak);
    if (afterRestart !== before) violate(soak, `disk-full: a restart on the full disk changed the state: ${before} -> ${afterRestart}`);
  } finally {
    for (const b of ballasts) await fsp.rm(b, { force: true });
  }
}

/** Reads (an exec included) answer on a full disk. */
async function readsOnFullDisk(soak: Soak, pod: Pod): Promise<void> {
  const { runtime, image } = soak.rt.cri;
  const reads: Array<[string, () => Promise<unknown>]> = [
    ['Status', () => runtime.Status({})],
    ['PodSandboxStatus', () => runtime.PodSandboxStatus({ pod_sandbox_id: pod.id })],
    ['ContainerStatus', () => runtime.ContainerStatus({ container_id: pod.ticker })],
    ['ImageFsInfo', () => image.ImageFsInfo({})],
    ['ExecSync', () => runtime.ExecSync({ container_id: pod.ticker, cmd: ['echo', 'x'], timeout: 30 })],
  ];
  for (const [method, send] of reads)
    await call(soak, send()).catch((err: Error) => violate(soak, `disk-full: ${method} failed on a full state disk: ${err.message}`));
}

/** A new pod, a new container and a pull are refused as RESOURCE_EXHAUSTED on a full disk. */
async function refusalsOnFullDisk(soak: Soak, pod: Pod): Promise<void> {
  const refused = async (what: string, request: Promise<unknown>): Promise<void> => {
    const err = await request.then(
      () => undefined,
      (e: { code?: number; details?: string; message: string }) => e,
    );
    if (err === undefined) violate(soak, `disk-full: ${what} succeeded on a full state disk`);
    else if (err.code !== status.RESOURCE_EXHAUSTED)
      violate(soak, `disk-full: ${what} failed with "${err.message}", not RESOURCE_EXHAUSTED`);
    else soak.progress(`  ${what} refused: ${err.details ?? err.message}`);
  };
  const name = `soak${soak.seq.pod++}`;
  const config = podConfig(soak.rt, name);
  await refused('RunPodSandbox', call(soak, soak.rt.cri.runtime.RunPodSandbox({ config })));
  await refused(
    'CreateContainer',
    call(
      soak,
      soak.rt.cri.runtime.CreateContainer({
        pod_sandbox_id: pod.id,
        config: {
          metadata: { name: `full${soak.seq.container++}`, attempt: 0 },
          image: { image: soak.images.image },
          command: ['true'],
          log_path: 'full.log',
        },
        sandbox_config: pod.config,
      }),
    ),
  );
  await refused('PullImage', call(soak, soak.rt.cri.image.PullImage({ image: { image: soak.images.onFullDisk } })));
}

/** Fill the file system holding `file` to its last page: write until ENOSPC. Returns the bytes written. */
async function fillDisk(file: string): Promise<number> {
  const handle = await fsp.open(file, 'wx', 0o600);
  let total = 0;
  try {
    for (const size of [1 << 20, 4096]) {
      const chunk = Buffer.alloc(size, 0x61);
      for (;;) {
        const written = await handle.write(chunk).then(
          (r) => r.bytesWritten,
          (err: unknown) => {
            if (errnoCode(err) === 'ENOSPC') return 0;
            throw err;
          },
        );
        total += written;
        if (written < size) break;
      }
    }
  } finally {
    await handle.close();
  }
  return total;
}
