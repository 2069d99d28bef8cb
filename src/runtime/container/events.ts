/** The container event stream behind GetContainerEvents (the kubelet's evented PLEG) and a face's OOM events. */
import { epochNs } from '../../common/time.js';
import type { ContainerRecord } from './record.js';

export type ContainerEventType =
  | 'CONTAINER_CREATED_EVENT'
  | 'CONTAINER_STARTED_EVENT'
  | 'CONTAINER_STOPPED_EVENT'
  | 'CONTAINER_DELETED_EVENT';

export interface ContainerEvent {
  type: ContainerEventType;
  /** Nanoseconds since the epoch. */
  atNs: string;
  /** A copy of the record as it was when the event happened. */
  record: ContainerRecord;
}

/**
 * The guest's OOM killer ended the container (its cgroup's memory.events counted an oom_kill).
 * The guest reports it with the exit of the container's process, so it comes just before that
 * container's CONTAINER_STOPPED_EVENT; an OOM kill of another process in a container that keeps
 * running is not reported.
 */
export interface ContainerOomEvent {
  /** When the container exited (the guest's time), nanoseconds since the epoch. */
  atNs: string;
  record: ContainerRecord;
}

/**
 * Subscribers get every event after they subscribed; a slow one never blocks the others. The
 * lifecycle events (`subscribe`) are the CRI's four; OOM kills (`subscribeOom`, containerd's
 * TaskOOM) are apart, emitted before the stop they caused.
 */
export class ContainerEvents {
  private readonly listeners = new Set<(e: ContainerEvent) => void>();
  private readonly oomListeners = new Set<(e: ContainerOomEvent) => void>();

  subscribe(listener: (e: ContainerEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  subscribeOom(listener: (e: ContainerOomEvent) => void): () => void {
    this.oomListeners.add(listener);
    return () => this.oomListeners.delete(listener);
  }

  emit(type: ContainerEventType, record: ContainerRecord): void {
    const event = { type, atNs: epochNs().toString(), record: structuredClone(record) };
    for (const l of this.listeners) l(event);
  }

  emitOom(record: ContainerRecord, atNs: string): void {
    const event = { atNs, record: structuredClone(record) };
    for (const l of this.oomListeners) l(event);
  }
}
