/**
 * The runtime's templates on a node (docs/templates.md, "The template store"): one directory per
 * template under a root on tmpfs, named after what the template was built from, built once and
 * verified before each use, rebuilt when its inputs change; and a clone taken from it with the
 * reason kept when that fails, so that the caller can fall back to the pool or a cold boot.
 *
 * Names: `<shape>-<key>`, where `<shape>` is a prefix of the template argv's digest (the handler
 * shape, its devices and kernel parameters) and `<key>` a prefix of the whole key's digest (also
 * QEMU, kernel, initrd and guest image). A directory of the same shape under another key was
 * built from inputs that changed since: it is stale and removed once the current one is ready.
 * Removing it is safe while clones run from it: each clone maps the RAM file private and keeps
 * the file's pages through its mapping; the memory goes when the last such clone ends.
 */
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { AgentClient } from '../../agent-client/index.js';
import { errorMessage, isKataError } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { TemplateKey, TemplateRecord, TemplateVmSpec } from '../../hypervisor/template.js';
import { buildTemplate, computeTemplateKey, loadVerifiedTemplate, templateInputFingerprint } from '../../hypervisor/template-execute.js';
import { POOL_NICE } from '../pool/vm.js';
import { warmUpGuest } from '../pool/warm.js';
import { type ReadyClone, type ReadyCloneOptions, startReadyClone } from './clone.js';

/** Hex digits of each digest in a template directory's name. */
const NAME_DIGITS = 16;
const NAME = /^([0-9a-f]{16})-([0-9a-f]{16})$/;

/** Pure: the directory name of the template for `key`, and the shape part alone. */
export function templateDirName(key: TemplateKey): { shape: string; name: string } {
  const shape = key.argvSha256.slice(0, NAME_DIGITS);
  const whole = createHash('sha256')
    .update(JSON.stringify([key.qemuBinarySha256, key.kernelSha256, key.initrdSha256, key.guestImageSha256, key.argvSha256]))
    .digest('hex');
  return { shape, name: `${shape}-${whole.slice(0, NAME_DIGITS)}` };
}

/**
 * Pure: which entries of the store's root are stale once `wanted` is ready: the same shape under
 * another key. Entries not named like templates (nothing this store made) are left alone.
 */
export function staleTemplateDirs(entries: readonly string[], wanted: { shape: string; name: string }): string[] {
  return entries.filter((e) => {
    const m = NAME.exec(e);
    return m !== null && m[1] === wanted.shape && e !== wanted.name;
  });
}

export interface TemplateStoreOptions {
  /** On tmpfs (buildTemplate checks): the templates' directories. Created if missing. */
  root: string;
  /** Where a template VM's sockets and logs live while it is built (a directory per build, removed after). */
  workRoot: string;
  qemuBinary: string;
  /** The daemon's version, for the agents' Hello. */
  hostVersion: string;
  /** Bound for the template VM's agent to answer after its boot. */
  bootTimeoutMs: number;
  logger: Logger;
}

export interface ReadyTemplate {
  templateDir: string;
  key: TemplateKey;
  record: TemplateRecord;
  /** Built by this call (false: an existing one verified). */
  built: boolean;
}

/** A clone, or why there is none (the caller falls back to the pool or a cold boot). */
export type CloneOutcome =
  | { kind: 'clone'; clone: ReadyClone; template: ReadyTemplate }
  | { kind: 'miss'; reason: string; message: string };

export class TemplateStore {
  /** One build at a time per template: concurrent pods of one shape wait for the same build. */
  private readonly inflight = new Map<string, Promise<ReadyTemplate>>();

  constructor(private readonly options: TemplateStoreOptions) {}

  /** The last key computed per input fingerprint: hashing the guest image (~100 MiB) at every clone costs ~0.4 s. */
  private readonly keys = new Map<string, TemplateKey>();

  /** The key of `spec`'s template: computed again only when an input file changed since (its fingerprint). */
  async keyOf(spec: TemplateVmSpec): Promise<TemplateKey> {
    const fingerprint = await templateInputFingerprint(this.options.qemuBinary, spec);
    const known = this.keys.get(fingerprint);
    if (known !== undefined) return known;
    const key = await computeTemplateKey(this.options.qemuBinary, spec);
    // Checked again after hashing: a file that changed meanwhile is not remembered under the old fingerprint.
    if ((await templateInputFingerprint(this.options.qemuBinary, spec)) === fingerprint) {
      // Old fingerprints (files since replaced) are never asked again: bound what they hold.
      if (this.keys.size >= 64) this.keys.clear();
      this.keys.set(fingerprint, key);
    }
    return key;
  }

  /** The verified template for `spec`, built (or rebuilt) first when there is none fit for use. */
  async ensure(spec: TemplateVmSpec): Promise<ReadyTemplate> {
    const key = await this.keyOf(spec);
    const names = templateDirName(key);
    const pending = this.inflight.get(names.name);
    if (pending !== undefined) return pending;
    const work = this.ensureKey(spec, key, names).finally(() => this.inflight.delete(names.name));
    this.inflight.set(names.name, work);
    return work;
  }

  /**
   * The verified template for `spec` as it is now, without building: TEMPLATE_RAM_FILE_INVALID,
   * TEMPLATE_STATE_CORRUPT, TEMPLATE_KEY_MISMATCH... when the one there is unfit (or ENOENT when
   * there is none). What a pod's clone uses: a pod never waits for a build.
   */
  async verified(spec: TemplateVmSpec): Promise<ReadyTemplate> {
    const key = await this.keyOf(spec);
    const templateDir = path.join(this.options.root, templateDirName(key).name);
    const { record } = await loadVerifiedTemplate(templateDir, key);
    return { templateDir, key, record, built: false };
  }

  /**
   * Restore a clone from `spec`'s template (built first if needed, unless `build` is false) and
   * make it ready (reseeded). Never throws for a failed template or clone: the outcome names the
   * reason (a KataError's code, else TEMPLATE_CLONE_FAILED) and message; the clone's QEMU is
   * gone by then.
   */
  async tryClone(
    spec: TemplateVmSpec,
    clone: Omit<ReadyCloneOptions, 'qemuBinary' | 'spec' | 'key' | 'templateDir' | 'logger' | 'hostVersion'>,
    { build = true }: { build?: boolean } = {},
  ): Promise<CloneOutcome> {
    const log = this.options.logger;
    try {
      const template = build ? await this.ensure(spec) : await this.verified(spec);
      const ready = await startReadyClone(
        {
          ...clone,
          qemuBinary: this.options.qemuBinary,
          spec,
          key: template.key,
          templateDir: template.templateDir,
          logger: log,
          hostVersion: this.options.hostVersion,
        },
        log,
      );
      return { kind: 'clone', clone: ready, template };
    } catch (err) {
      const reason = isKataError(err) ? err.reason : 'TEMPLATE_CLONE_FAILED';
      log.warn({ reason, err: errorMessage(err), name: clone.name }, 'no clone from the template');
      return { kind: 'miss', reason, message: errorMessage(err) };
    }
  }

  private async ensureKey(spec: TemplateVmSpec, key: TemplateKey, names: { shape: string; name: string }): Promise<ReadyTemplate> {
    const { root, logger } = this.options;
    await fsp.mkdir(root, { recursive: true, mode: 0o700 });
    const templateDir = path.join(root, names.name);
    let ready: ReadyTemplate | undefined;
    if (await exists(templateDir)) {
      try {
        const { record } = await loadVerifiedTemplate(templateDir, key);
        ready = { templateDir, key, record, built: false };
      } catch (err) {
        // Half built (a daemon that died mid-build), altered or damaged: never used, built again.
        // Clones running from it keep their private mappings of its RAM file.
        logger.warn({ templateDir, err: errorMessage(err) }, 'template unfit for use; rebuilding it');
        await fsp.rm(templateDir, { recursive: true, force: true });
      }
    }
    if (ready === undefined) ready = { templateDir, key, record: await this.build(spec, key, templateDir), built: true };
    for (const stale of staleTemplateDirs(await fsp.readdir(root), names)) {
      logger.info({ templateDir: path.join(root, stale) }, 'removing a template built from older inputs');
      await fsp.rm(path.join(root, stale), { recursive: true, force: true });
    }
    return ready;
  }

  private async build(spec: TemplateVmSpec, key: TemplateKey, templateDir: string): Promise<TemplateRecord> {
    const { workRoot, qemuBinary, hostVersion, bootTimeoutMs, logger } = this.options;
    await fsp.mkdir(workRoot, { recursive: true, mode: 0o700 });
    const workDir = await fsp.mkdtemp(path.join(workRoot, 'template-build-'));
    try {
      const record = await buildTemplate({
        qemuBinary,
        spec,
        key,
        templateDir,
        workDir,
        logger,
        nice: POOL_NICE,
        waitAgentReady: async (agentSocket) => {
          // Hello answered: the agent is up. It runs the warm-up pod (src/runtime/pool/warm.ts), so
          // that every clone starts with the container path compiled and crun in its page cache.
          // The connection is closed before the save, so that no half-open session is frozen into
          // the state and each clone's first dial is its own.
          const agent = await AgentClient.connect({ socketPath: agentSocket, logger, hostVersion }, bootTimeoutMs);
          try {
            const warm = await warmUpGuest(agent, bootTimeoutMs, logger);
            logger.info({ warmUpMs: warm.ms, steps: warm.steps, failed: warm.failed }, 'template VM warmed up');
          } finally {
            agent.close();
          }
        },
      });
      logger.info({ templateDir, buildMs: record.buildMs, stateBytes: record.stateBytes }, 'template built');
      return record;
    } finally {
      await fsp.rm(workDir, { recursive: true, force: true });
    }
  }
}

async function exists(p: string): Promise<boolean> {
  return fsp.lstat(p).then(
    () => true,
    () => false,
  );
}
