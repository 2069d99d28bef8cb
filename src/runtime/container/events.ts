/** The container event stream behind GetContainerEvents (the kubelet's evented PLEG). */
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

/** Subscribers get every event after they subscribed; a slow one never blocks the others. */
export class ContainerEvents {
  private readonly listeners = new Set<(e: ContainerEvent) => void>();

  subscribe(listener: (e: ContainerEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  emit(type: ContainerEventType, record: ContainerRecord): void {
    const event = { type, atNs: epochNs().toString(), record: structuredClone(record) };
    for (const l of this.listeners) l(event);
  }
}
