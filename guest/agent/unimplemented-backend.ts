import { unimplemented } from '../../src/common/errors.js';
import type { ContainerBackend } from './backend.js';
import { readGuestFacts } from './facts.js';

const no = (what: string) => () => Promise.reject(unimplemented('AGENT_NO_CONTAINER_BACKEND', `this agent build cannot ${what}.`));

/**
 * A backend that knows the guest's facts and runs nothing: what main.ts serves until the crun
 * backend (guest/agent/containers/) is wired in, so Hello and the channel work on their own.
 */
export function unimplementedBackend(): ContainerBackend {
  return {
    guestFacts: () => readGuestFacts(),
    createContainer: no('create containers'),
    startContainer: no('start containers'),
    signalContainer: no('signal containers'),
    waitContainer: no('wait for containers'),
    deleteContainer: no('delete containers'),
    listContainers: async () => [],
    containerStats: async () => [],
    guestStats: no('report guest stats'),
    execProcess: no('exec processes'),
    signalProcess: no('signal processes'),
    resizeTty: no('resize terminals'),
    waitProcess: no('wait for processes'),
    deleteProcess: no('delete processes'),
    onEvent: () => () => {},
  };
}
