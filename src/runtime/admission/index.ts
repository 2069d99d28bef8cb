/**
 * CreateContainer admission (pure): the KEP-4112 diff between what RunPodSandbox announced and
 * what CreateContainer asks for, its FAILED_PRECONDITION error, and the budget check for
 * sandboxes sized without pod_resources.
 */
export { admitAnnounced } from './admit.js';
export {
  type BudgetFit,
  type FitBudgetInput,
  fitBudget,
  type GrowPlan,
  type VmBudgetShape,
  type WorkloadCapacity,
  workloadCapacity,
} from './budget.js';
export {
  compareContainerType,
  containerTypeName,
  KATA_CONTAINER_TYPE_ANNOTATION,
  KATA_CONTAINER_TYPES,
  KUBELET_CONTAINER_TYPE_ANNOTATION,
} from './container-type.js';
export { type AdmissionDemand, containerDemand } from './demand.js';
export { admissionError, describeDifferences, MAX_DESCRIBED_DIFFERENCES, MAX_VALUE_CHARS } from './describe.js';
export { compareCdiDevices, compareDevices, permissionSet } from './devices.js';
export { compareMounts, propagationName } from './mounts.js';
export { compareKubernetesResources, resourcePath } from './resources.js';
export {
  ABSENT,
  type AdmissionResult,
  type AnnouncedContainer,
  type AnnouncedPodResources,
  type ContainerConfigInput,
  type Difference,
} from './types.js';
