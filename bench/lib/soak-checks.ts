/** The soak's invariants, checked after every fault and at the end (see bench/soak.ts). */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { NETNS_DIR } from '../../src/network/index.js';
import { auditOrphans, ownersFromRecords } from '../../src/runtime/sandbox/orphan-audit.js';
import { cgroupDirsUnder, ownNetnsNames } from '../../test/helpers/runtime-daemon.js';
import { call, containerCycle, type Pod, type Soak, violate } from './soak-context.js';

/** Every tick from 0 on, each once, in the ticker's CRI log. */
export async function checkTicker(soak: Soak, pod: Pod, label: string): Promise<void> {
  const text = await fsp.readFile(path.join(pod.logDir, 'ticker.log'), 'utf8').catch(() => '');
  const ticks = text
    .split('\n')
    .map((l) => /^\S+ stdout F tick-(\d+)$/.exec(l)?.[1])
    .filter((t): t is string => t !== undefined)
    .map(Number);
  const bad = ticks.findIndex((t, i) => t !== i);
  if (bad !== -1)
    violate(soak, `${label}: ticker log of ${pod.id.slice(0, 12)} has tick-${ticks[bad]} at line ${bad} (lost or duplicated)`);
}

/**
 * Every listed sandbox is the soak's, listed once, with a whole ticker log; a READY one has its
 * pod IP (with a pod network) and starts a container; a NOTREADY one is stopped and removed.
 * No pod the soak knows has vanished, and nothing under the state dir, the pod namespaces or the
 * cgroup parent is an orphan.
 */
export async function checkInvariants(soak: Soak, label: string): Promise<void> {
  const listed = (await call(soak, soak.rt.cri.runtime.ListPodSandbox({}))).items;
  if (new Set(listed.map((s) => s.id)).size !== listed.length) violate(soak, `${label}: a sandbox id is listed twice`);
  if (new Set(listed.map((s) => s.metadata?.uid)).size !== listed.length) violate(soak, `${label}: a pod uid is listed twice`);
  for (const s of listed) {
    const pod = soak.pods.get(s.id);
    if (pod === undefined) {
      violate(soak, `${label}: sandbox ${s.id.slice(0, 12)} is listed but the soak never made it`);
      continue;
    }
    await checkTicker(soak, pod, label);
    if (s.state === 'SANDBOX_READY') await checkReadyPod(soak, pod, label);
    else await checkNotReadyPod(soak, pod, label);
  }
  for (const id of [...soak.pods.keys()])
    if (!listed.some((s) => s.id === id)) violate(soak, `${label}: sandbox ${id.slice(0, 12)} vanished`);
  await checkNoOrphans(soak, label);
}

async function checkReadyPod(soak: Soak, pod: Pod, label: string): Promise<void> {
  try {
    if (soak.podNetwork) {
      const st = await call(
        soak,
        soak.rt.cri.runtime.PodSandboxStatus({
          pod_sandbox_id: pod.id,
        }),
      );
      if ((st.status?.network?.ip ?? '') === '') violate(soak, `${label}: sandbox ${pod.id.slice(0, 12)} is READY without a pod IP`);
    }
    await containerCycle(soak, pod);
  } catch (err) {
    violate(soak, `${label}: sandbox ${pod.id.slice(0, 12)} is READY but a container cannot start: ${(err as Error).message}`);
  }
}

async function checkNotReadyPod(soak: Soak, pod: Pod, label: string): Promise<void> {
  try {
    await call(soak, soak.rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: pod.id }));
    await call(soak, soak.rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: pod.id }));
    soak.pods.delete(pod.id);
  } catch (err) {
    violate(soak, `${label}: sandbox ${pod.id.slice(0, 12)} is NOTREADY but cannot be removed: ${(err as Error).message}`);
  }
}

async function checkNoOrphans(soak: Soak, label: string): Promise<void> {
  const { rt } = soak;
  const owners = await ownersFromRecords(rt.stateDir);
  // /run/netns is the machine's: only the namespaces of pods this daemon made (or began to make)
  // are judged, never another run's leftovers.
  const netns = soak.podNetwork ? { netnsDir: NETNS_DIR, netnsScope: await ownNetnsNames(rt, soak.everyPod) } : {};
  for (const o of await auditOrphans(owners, { stateDir: rt.stateDir, ...netns }))
    violate(soak, `${label}: orphan ${o.kind} ${o.path}${o.pid ? ` pid ${o.pid}` : ''}`);
  const ids = new Set(owners.sandboxes.map((s) => s.id));
  for (const dir of await cgroupDirsUnder(rt.cgroupRoot)) {
    const m = /\/kata-ts-([0-9a-f]{64})$/.exec(dir);
    if (m !== null && !ids.has(m[1]!)) violate(soak, `${label}: orphan cgroup ${dir}`);
  }
}

/** What a refused request must leave unchanged: the listed pods and containers, images and VM dirs. */
export async function stateSummary(soak: Soak): Promise<string> {
  const sandboxes = (await call(soak, soak.rt.cri.runtime.ListPodSandbox({}))).items;
  const containers = (await call(soak, soak.rt.cri.runtime.ListContainers({}))).containers;
  const images = (await call(soak, soak.rt.cri.image.ListImages({}))).images;
  const vmDirs = await fsp.readdir(path.join(soak.rt.stateDir, 'vm')).catch(() => []);
  return JSON.stringify({
    sandboxes: sandboxes.map((x) => `${x.id}:${x.state}`).sort(),
    containers: containers.map((x) => `${x.id}:${x.state}`).sort(),
    images: images.map((x) => x.id).sort(),
    vmDirs: vmDirs.sort(),
  });
}
