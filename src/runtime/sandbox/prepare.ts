/**
 * RunPodSandbox's first half: validate the request, gather the facts it needs (cgroup parent,
 * guest assets, the kubelet's PodResources, the CNI config, the host's PCIe inventory) and plan
 * the VM. Reads only: no file, directory, cgroup, namespace, process or record is made here, so a
 * request refused at any point of it leaves the node exactly as it was.
 */
import { existsSync, readFileSync } from 'node:fs';
import { errorMessage, isKataError, precondition } from '../../common/errors.js';
import type { KataConfig } from '../../config/types.js';
import { checkGuestAssets, guestImageVerityPath, readGuestImageVerity } from '../../hypervisor/index.js';
import { type Initdata, initdataFromAnnotations, initdataLaunch, snpHostData, tdxMrConfigId } from '../../measure/initdata.js';
import { plannedSnpReferenceValues, plannedTdxReferenceValues, plannedVtpmReferenceValues } from '../../measure/launch.js';
import type { ReferenceValues } from '../../measure/reference-values.js';
import type { PodNetworkRecord } from '../../network/index.js';
import { getKubeletPodResources, type KubeletPodResources } from '../../pcie/index.js';
import { readTpmCa } from '../../tpm/ca.js';
import { planSandbox, type SandboxPlan, type SandboxPlanInput } from '../plan.js';
import { cgroupParentOf } from '../spec/sandbox.js';
import type { CreateDeps, CreateRequest, SandboxLayout, SandboxPreparation } from './create-types.js';
import { networksFor, PLANNED_MAC, podNetworkRequest } from './network.js';
import {
  sandboxArgvPaths,
  sandboxJailDir,
  sandboxSharedDir,
  sandboxTeePaths,
  sandboxVmmDir,
  sandboxVmPaths,
  sandboxWorkDir,
  vmNameFor,
} from './paths.js';
import { checkPodSecretsAttestable, podSecretsFromAnnotations } from './pod-secrets.js';
import { nowNs, type SandboxRecord } from './record.js';
import { checkTpmFiles } from './tpm.js';

/** Validate, gather facts, plan; side-effect free (see the file's comment). */
export async function prepareSandbox(deps: CreateDeps, req: CreateRequest): Promise<SandboxPreparation> {
  const { config } = deps;
  const { spec } = req;
  const cgroupParent = cgroupParentOf(spec);
  deps.cgroups.validateParent(cgroupParent);
  const assets = await checkGuestAssets({
    kernelPath: config.hypervisor.kernelPath,
    initrdPath: config.hypervisor.initrdPath,
    guestImagePath: config.hypervisor.guestImagePath,
  });
  if (!assets.ok) throw precondition('GUEST_ASSETS_MISSING', assets.message);

  // The guest image's dm-verity table: a TEE pod's measured command line carries its root hash.
  const imagePath = config.hypervisor.guestImagePath;
  const guestImageVerity = imagePath === null ? null : await readGuestImageVerity(imagePath);

  const layout = sandboxLayout(config, req.id, req.handler.profile.vmmConfinement.unprivileged);
  // The pod's initdata (a malformed one is refused here, naming its annotation).
  const initdata = initdataFromAnnotations(spec.annotations);
  // The broker resources its containers ask for (names and paths only), refused the same way.
  const podSecrets = podSecretsFromAnnotations(spec.annotations);
  const kubelet = await askKubelet(config, req);
  const network = await prepareNetwork(deps, req);
  const planInput: SandboxPlanInput = {
    config: spec,
    handler: req.handler,
    host: deps.host,
    pcieFacts: await deps.readPcieFacts(),
    ...(kubelet === null ? {} : { kubelet }),
    accel: deps.facts.acceleration,
    hypervisor: config.hypervisor,
    vmName: vmNameFor(req.id),
    paths: sandboxArgvPaths(layout.workDir, config.hypervisor, layout.confined),
    ...(deps.facts.tee === undefined ? {} : { tee: deps.facts.tee }),
    teePaths: sandboxTeePaths(layout.workDir, layout.confined),
    guestImageVerity,
    ...(initdata === null ? {} : { initdata: { snpHostData: snpHostData(initdata), tdxMrConfigId: tdxMrConfigId(initdata) } }),
    simulateVfioWith: config.pcie.simulateVfioWith,
    // The NIC takes the CNI interface's MAC, known only after CNI ADD: planned now with a
    // placeholder (same slot, same everything else), planned again before QEMU starts. A joined
    // namespace's interface has its MAC already.
    // vhost-net where the host has it, QEMU's userspace virtio-net backend otherwise (the dev machines).
    ...(network === null
      ? {}
      : { nic: { tapName: network.record.tapName, mac: network.record.mac ?? PLANNED_MAC, vhost: existsSync('/dev/vhost-net') } }),
  };
  const plan = planSandbox(planInput);
  await checkTee(plan, config);
  // Initdata is taken only where a launch measurement binds it (a handler without a TEE: refused).
  if (initdata !== null) initdataLaunch(initdata, plan.tee?.kind ?? 'none', plan.handler);
  // Secrets only for a pod that can attest: measured by a TEE, with a broker to ask.
  checkPodSecretsAttestable(podSecrets, plan.tee?.kind ?? 'none', plan.handler, initdata);
  req.logger.info(
    { handler: plan.handler, source: plan.sizing.source, vm: plan.sizing.vm, pcie: plan.pcie.description, vmm: plan.vmm, tee: plan.tee },
    'sandbox planned',
  );
  if (plan.vmm.optOutReason !== null) {
    req.logger.warn(
      { handler: plan.handler, seccomp: plan.vmm.seccomp !== null, unprivileged: plan.vmm.unprivileged, reason: plan.vmm.optOutReason },
      'the handler runs this QEMU less confined',
    );
  }
  const record = firstRecord(deps, req, plan, network?.record ?? null);
  if (Object.keys(podSecrets).length > 0) record.podSecrets = podSecrets;
  try {
    record.referenceValues = predictedMeasurements(plan, config, req, initdata);
  } catch (err) {
    // A launch kata-ts cannot predict (a kernel outside the boot protocol it models, say) still
    // boots, measured as ever; only its predicted values are missing, and the log says why.
    record.referenceValues = null;
    req.logger.warn(
      { err: errorMessage(err), reason: isKataError(err) ? err.reason : undefined },
      "the pod's launch measurements could not be predicted",
    );
  }
  return { req, cgroupParent, layout, network, planInput, record };
}

/**
 * What a TEE pod's launch will measure, predicted now, before anything boots, from the planned
 * argv and the very files it names (as `kata-ts plan --measurements` does): shown in verbose
 * status for the lab to check the guest's evidence against. Null without a TEE.
 */
function predictedMeasurements(
  plan: SandboxPlan,
  config: KataConfig,
  req: CreateRequest,
  initdata: Initdata | null,
): ReferenceValues | null {
  const kind = plan.tee?.kind ?? 'none';
  if (kind === 'none') return null;
  const pod = { name: req.spec.metadata.name, namespace: req.spec.metadata.namespace, uid: req.spec.metadata.uid };
  const read = (p: string) => readFileSync(p);
  const launch = { argv: plan.qemu.argv, pod, handler: plan.handler, read };
  if (kind === 'vtpm') {
    return plannedVtpmReferenceValues({
      ...launch,
      ovmfVarsTemplatePath: config.hypervisor.firmware.ovmfVarsPath,
      initdata: initdata?.document ?? null,
    });
  }
  const hardware = { ...launch, initdata, cpuinfo: () => readFileSync('/proc/cpuinfo', 'utf8') };
  return kind === 'snp' ? plannedSnpReferenceValues(hardware) : plannedTdxReferenceValues(hardware);
}

/**
 * A pod never claims a TEE it does not get: a handler that resolved to SNP or TDX on a host that
 * cannot start it (QEMU too old, no such hardware, no KVM) is refused, and a vtpm pod needs its
 * firmware and swtpm present.
 */
async function checkTee(plan: SandboxPlan, config: KataConfig): Promise<void> {
  const tee = plan.tee;
  if (tee === undefined) return;
  if (tee.launchProblem !== null) {
    throw precondition(
      'TEE_UNAVAILABLE',
      `handler "${plan.handler}" resolved to tee.kind ${tee.kind}, which cannot start here: ${tee.launchProblem}.`,
      {
        details: { field: 'tee.kind', handler: plan.handler, kind: tee.kind, problem: tee.launchProblem },
      },
    );
  }
  // A TEE pod whose /usr nothing would measure is refused: its agent (which extends PCR 8 and
  // answers for the pod) could be any the host likes.
  if (tee.guestImage != null && tee.guestImage.verity === null) {
    throw precondition(
      'GUEST_IMAGE_UNVERIFIED',
      `handler "${plan.handler}" runs a TEE (${tee.kind}) but the guest image ${tee.guestImage.path} has no dm-verity metadata ${guestImageVerityPath(tee.guestImage.path)} (build it with scripts/build-guest.sh).`,
      { details: { field: 'hypervisor.guestImagePath', handler: plan.handler, path: tee.guestImage.path } },
    );
  }
  if (tee.firmware !== null && 'ovmfCode' in tee.firmware) {
    // The node's EK CA signs the pod TPM's EK certificate: none (setup not run) refuses here, nothing made.
    await readTpmCa(config.hypervisor.tpm.caDir);
    await checkTpmFiles({
      'hypervisor.firmware.ovmfCodePath': tee.firmware.ovmfCode,
      'hypervisor.firmware.ovmfVarsPath': tee.firmware.ovmfVarsTemplate,
      'hypervisor.tpm.swtpmBinary': config.hypervisor.tpm.swtpmBinary,
      'hypervisor.tpm.swtpmSetupBinary': config.hypervisor.tpm.swtpmSetupBinary,
    });
  }
}

/**
 * The pod network, validated and recorded, nothing made: a namespace the caller made and attached
 * (joinNetns: it must exist, be a network namespace and have eth0 with an address; whatever the
 * configured network mode, and without the CNI-mode checks, which are the caller's), or the
 * configured CNI network (a host-network pod, a missing CNI config or plugin refuse here), or none.
 */
async function prepareNetwork(deps: CreateDeps, req: CreateRequest): Promise<SandboxPreparation['network']> {
  if (req.joinNetns !== undefined) {
    const networks = networksFor(deps);
    return { networks, record: await networks.prepareJoin(req.joinNetns) };
  }
  if (deps.network === undefined) return null;
  return { networks: deps.network, record: await deps.network.prepare(req.id, podNetworkRequest(req.id, req.spec)) };
}

/** The plan of `input` with the NIC's real MAC (input has no NIC: the same plan). Pure. */
export function planWithMac(input: SandboxPlanInput, mac: string): SandboxPlan {
  return planSandbox(input.nic === undefined ? input : { ...input, nic: { ...input.nic, mac } });
}

function sandboxLayout(config: KataConfig, sandboxId: string, confined: boolean): SandboxLayout {
  const workDir = sandboxWorkDir(config.stateDir, sandboxId);
  const { agentSocket, virtiofsSocket, virtiofsdLog, ...vmPaths } = sandboxVmPaths(workDir, confined);
  return {
    workDir,
    confined,
    vmmDir: sandboxVmmDir(workDir),
    jailDir: sandboxJailDir(workDir),
    sharedDir: sandboxSharedDir(config.stateDir, sandboxId),
    vmPaths,
    agentSocket,
    virtiofsSocket,
    virtiofsdLog,
    withAgent: config.hypervisor.guestImagePath !== null,
  };
}

function firstRecord(deps: CreateDeps, req: CreateRequest, plan: SandboxPlan, network: PodNetworkRecord | null): SandboxRecord {
  const { spec } = req;
  return {
    id: req.id,
    phase: 'creating',
    state: 'SANDBOX_NOTREADY',
    createdAtNs: nowNs(),
    metadata: spec.metadata,
    labels: spec.labels,
    annotations: spec.annotations,
    runtimeHandler: req.runtimeHandler,
    handler: plan.handler,
    cgroupDriver: deps.cgroups.name,
    spec,
    plan,
    shape: plan.sizing.vm,
    topology: plan.pcie.topology,
    vmm: null,
    confinement: null,
    virtiofsd: null,
    placement: null,
    guest: null,
    guestPod: null,
    network,
    exit: null,
  };
}

/**
 * Where a kubelet sends no pod_resources (all released kubelets), the devices assigned to the pod
 * can be asked of the kubelet's PodResources API, as Kata does; off unless a socket is configured.
 */
async function askKubelet(config: KataConfig, req: CreateRequest): Promise<KubeletPodResources | null> {
  const socket = config.pcie.podResourcesSocket;
  if (socket === null || (req.spec.pod_resources?.containers.length ?? 0) > 0) return null;
  const { namespace, name } = req.spec.metadata;
  return getKubeletPodResources(socket, namespace, name, { timeoutMs: 5000 });
}
