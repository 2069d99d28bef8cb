export { parseContainerdConfig } from './document.js';
export {
  DEFAULT_CONTAINERD_CONFIG,
  defaultBackupPath,
  defaultStatePath,
  executePlan,
  gatherInstallInput,
  gatherUninstallInput,
  type InstallPaths,
  underRoot,
} from './files.js';
export {
  CONTAINER_ANNOTATIONS,
  handlerTable,
  KATA_TS_RUNTIMES,
  POD_ANNOTATIONS,
  SANDBOXERS,
  type Sandboxer,
  tableName,
} from './handlers.js';
export { type ConfigInspection, type HandlerPresence, inspectContainerdConfig } from './inspect.js';
export { type FileChange, type InstallPlan, type InstallRecord, planInstall, planUninstall } from './plan.js';
export { detectContainerdVersion } from './probe.js';
export { type ContainerdVersion, formatVersion, parseContainerdVersion, requireSupported, supportedSchemas } from './version.js';
