/**
 * The daemon's templates (docs/templates.md, "Pods from a template"): for each handler named in
 * `templates.handlers`, its template built in the background once the daemon runs (and again when
 * its inputs change), and RunPodSandbox's first question: a clone grown into the pod, or why not
 * (the pod then asks the pool, then boots cold; the reason is in its status). A pod never waits
 * for a build: a template not ready yet is a miss.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errorMessage, isKataError, precondition } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { packageVersion } from '../../common/paths.js';
import { resolveHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import type { TemplateKey } from '../../hypervisor/template.js';
import type { PcieHostFacts } from '../../pcie/index.js';
import type { HostCapacity } from '../../sizing/types.js';
import type { RuntimeFacts } from '../facts.js';
import type { CreateDeps, SandboxPreparation, SandboxTemplates, TemplateAnswer } from '../sandbox/create-types.js';
import { killAndWait, qemuPidsUsing } from '../sandbox/orphans.js';
import { claimClone } from './claim.js';
import { planTemplateVm, type TemplateMiss, type TemplateVmPlan, templateMiss } from './plan.js';
import { TemplateStore } from './store.js';
import './reasons.js';

/**
 * A clone's miss reasons that say the template itself is unfit for use (so it is rebuilt); a
 * template removed from the root is TEMPLATE_RECORD_INVALID (its record cannot be read).
 */
const TEMPLATE_UNFIT = new Set(['TEMPLATE_KEY_MISMATCH', 'TEMPLATE_RECORD_INVALID', 'TEMPLATE_STATE_CORRUPT', 'TEMPLATE_RAM_FILE_INVALID']);

export interface TemplateManagerDeps {
  config: KataConfig;
  facts: RuntimeFacts;
  host: HostCapacity;
  readPcieFacts(): Promise<PcieHostFacts>;
  logger: Logger;
}

/** A handler's template in the daemon's verbose Status (`templates`). */
export interface TemplateHandlerStatus {
  handler: string;
  phase: 'building' | 'ready' | 'failed';
  templateName: string | null;
  buildMs: number | null;
  failure: TemplateMiss | null;
  clones: number;
  misses: number;
  lastMiss: TemplateMiss | null;
}

/** One handler's template as the daemon knows it: its status and the key it was built for. */
type HandlerTemplate = Omit<TemplateHandlerStatus, 'handler'> & { key: TemplateKey | null };

/** The template VMs' build dirs (sockets, logs): under the state dir, removed after each build. */
export function templateBuildRoot(stateDir: string): string {
  return path.join(stateDir, 'template-builds');
}

/**
 * The templates' root must be a directory of the daemon's user that no one else may write: any
 * user may create names in /dev/shm, and a template dir someone else planted (with a RAM file of
 * their making and a record that matches it) would be mapped into every clone. Made (0700) when
 * missing; anything else is TEMPLATE_ROOT_UNSAFE.
 */
export async function ensureTemplateRoot(root: string, uid = process.getuid?.() ?? 0): Promise<void> {
  await fsp.mkdir(root, { mode: 0o700 }).catch((err: unknown) => {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  });
  const st = await fsp.lstat(root);
  const problem = !st.isDirectory()
    ? 'is not a directory (a link or a file)'
    : st.uid !== uid
      ? `belongs to uid ${st.uid}, not the daemon's ${uid}`
      : (st.mode & 0o022) !== 0
        ? `is writable by others (mode ${(st.mode & 0o7777).toString(8)})`
        : null;
  if (problem !== null) {
    throw precondition('TEMPLATE_ROOT_UNSAFE', `templates.root ${root} ${problem}: no template is built or used there.`, {
      details: { root },
    });
  }
}

export class TemplateManager implements SandboxTemplates {
  private readonly store: TemplateStore;
  private readonly handlers = new Map<string, HandlerTemplate>();
  private pcieFacts: PcieHostFacts | undefined;
  private rootProblem: TemplateMiss | null = null;
  private closed = false;
  private readonly builds = new Set<Promise<void>>();

  constructor(private readonly deps: TemplateManagerDeps) {
    const { config, logger } = deps;
    this.store = new TemplateStore({
      root: config.templates.root,
      workRoot: templateBuildRoot(config.stateDir),
      qemuBinary: config.hypervisor.qemuBinary,
      hostVersion: packageVersion(),
      bootTimeoutMs: config.hypervisor.readyTimeoutMs,
      logger: logger.child({ component: 'templates' }),
    });
    for (const handler of config.templates.handlers) {
      this.handlers.set(handler, {
        phase: 'building',
        key: null,
        templateName: null,
        buildMs: null,
        failure: null,
        clones: 0,
        misses: 0,
        lastMiss: null,
      });
    }
  }

  /** Handlers that clone (templates.handlers). */
  get enabled(): boolean {
    return this.handlers.size > 0;
  }

  /**
   * At daemon start: a template VM left by a daemon that died mid-build is ended (ours: its
   * sockets are in our build root), the root checked, and each handler's build started.
   */
  async start(): Promise<void> {
    const workRoot = templateBuildRoot(this.deps.config.stateDir);
    // Each build's dir goes when it ends: one left means a build the last daemon did not finish
    // (only then is /proc searched for its VM, not at every start).
    if ((await fsp.readdir(workRoot).catch(() => [])).length > 0) {
      for (const pid of await qemuPidsUsing(workRoot)) await killAndWait(pid);
    }
    await fsp.rm(workRoot, { recursive: true, force: true });
    if (!this.enabled) return;
    try {
      await ensureTemplateRoot(this.deps.config.templates.root);
    } catch (err) {
      this.rootProblem = { reason: isKataError(err) ? err.reason : 'TEMPLATE_BUILD_FAILED', message: errorMessage(err) };
      this.deps.logger.error({ err: errorMessage(err) }, 'templates are off: their root is unsafe');
      for (const t of this.handlers.values()) {
        t.phase = 'failed';
        t.failure = this.rootProblem;
      }
      return;
    }
    for (const handler of this.handlers.keys()) this.build(handler);
  }

  private async planFor(handlerName: string): Promise<TemplateVmPlan> {
    const { config, facts, host } = this.deps;
    this.pcieFacts ??= await this.deps.readPcieFacts();
    return planTemplateVm({
      handler: resolveHandler(config, handlerName),
      host,
      hypervisor: config.hypervisor,
      accel: facts.acceleration,
      pcieFacts: this.pcieFacts,
      simulateVfioWith: config.pcie.simulateVfioWith,
    });
  }

  /** (Re)build a handler's template in the background; its state says how it went. */
  private build(handlerName: string): void {
    const t = this.handlers.get(handlerName);
    if (t === undefined || this.closed || this.rootProblem !== null) return;
    t.phase = 'building';
    const log = this.deps.logger.child({ component: 'templates', handler: handlerName });
    const started = Date.now();
    const work = (async () => {
      try {
        const ready = await this.store.ensure((await this.planFor(handlerName)).spec);
        t.phase = 'ready';
        t.key = ready.key;
        t.templateName = path.basename(ready.templateDir);
        t.buildMs = ready.built ? ready.record.buildMs : (t.buildMs ?? ready.record.buildMs);
        t.failure = null;
        log.info({ templateName: t.templateName, built: ready.built, ms: Date.now() - started }, 'template ready');
      } catch (err) {
        t.phase = 'failed';
        t.failure = { reason: isKataError(err) ? err.reason : 'TEMPLATE_BUILD_FAILED', message: errorMessage(err) };
        log.error({ err: errorMessage(err) }, 'the template could not be built; pods of this handler do not clone until it is');
      }
    })();
    this.builds.add(work);
    void work.finally(() => this.builds.delete(work));
  }

  /**
   * RunPodSandbox's first question (CreateDeps.templates): a clone grown into `prep`'s plan, or
   * why not (null when the handler does not clone at all). A failed clone leaves nothing behind.
   */
  async clone(deps: CreateDeps, prep: SandboxPreparation): Promise<TemplateAnswer> {
    const handlerName = prep.record.plan.handler;
    const t = this.handlers.get(handlerName);
    if (t === undefined) return { kind: 'miss', miss: null };
    const missed = (miss: TemplateMiss): TemplateAnswer => {
      t.misses++;
      t.lastMiss = miss;
      prep.req.logger.info({ reason: miss.reason, why: miss.message }, 'pod does not start from a template');
      return { kind: 'miss', miss };
    };
    let plan: TemplateVmPlan;
    try {
      plan = await this.planFor(handlerName);
    } catch (err) {
      return missed({ reason: 'TEMPLATE_NO_FIT', message: `the template could not be planned: ${errorMessage(err)}` });
    }
    const network = prep.network?.record;
    const fit = templateMiss({
      plan: prep.record.plan,
      optedIn: true,
      template: plan,
      joinsNetns: prep.req.joinNetns !== undefined,
      withAgent: prep.layout.withAgent,
      cniOrNone: network === undefined || network.kind === 'cni',
    });
    if (fit !== null) return missed(fit);
    if (t.phase === 'failed') {
      const failure = t.failure ?? { reason: 'TEMPLATE_BUILD_FAILED', message: 'the template build failed' };
      // Tried again for the next pod (a root problem stays until the daemon restarts).
      this.build(handlerName);
      return missed({ reason: 'TEMPLATE_BUILD_FAILED', message: `${failure.reason}: ${failure.message}` });
    }
    if (t.phase === 'building' || t.key === null) {
      return missed({ reason: 'TEMPLATE_NOT_READY', message: `the template of handler "${handlerName}" is still being built` });
    }
    // Inputs replaced since the build (a new guest image, kernel or QEMU): rebuilt, never waited for.
    const keyNow = await this.store.keyOf(plan.spec);
    if (JSON.stringify(keyNow) !== JSON.stringify(t.key)) {
      this.build(handlerName);
      return missed({
        reason: 'TEMPLATE_NOT_READY',
        message: `the template of handler "${handlerName}" is being rebuilt: its inputs changed since it was built`,
      });
    }
    const outcome = await claimClone(
      { deps, prep, store: this.store, spec: plan.spec },
      prep.req.logger.child({ template: t.templateName }),
    );
    if (outcome.kind === 'miss') {
      // A template found unfit (altered, damaged, removed) is rebuilt in the background.
      if (TEMPLATE_UNFIT.has(outcome.miss.reason)) this.build(handlerName);
      return missed(outcome.miss);
    }
    t.clones++;
    return { kind: 'clone', created: outcome.created };
  }

  status(): TemplateHandlerStatus[] {
    return [...this.handlers].map(([handler, { key: _key, ...t }]) => ({ handler, ...t }));
  }

  /**
   * Stop: a build in flight is ended (its QEMU, started by this daemon, found by its sockets in
   * our build root) and waited for, so no template VM outlives the daemon. Templates made stay.
   */
  async close(): Promise<void> {
    this.closed = true;
    if (this.builds.size === 0) return;
    for (const pid of await qemuPidsUsing(templateBuildRoot(this.deps.config.stateDir)).catch(() => [])) {
      await killAndWait(pid).catch(() => undefined);
    }
    await Promise.allSettled([...this.builds]);
  }
}
