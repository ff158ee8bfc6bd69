"""Embedded code corpus: ``CORPUS`` trains the default checkpoint's byte-level BPE tokenizer; ``CORPUS`` and
``CODE`` (``training_documents()``) train its weights (``train_default.py``).

Plain text only. Changing ``CORPUS`` changes the default tokenizer (and so every test's token ids);
changing ``CODE`` or ``training_documents`` changes only what retraining the weights asset gives.
"""

CORPUS: tuple[str, ...] = (
    '''def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b


def quicksort(items):
    if len(items) <= 1:
        return items
    pivot = items[len(items) // 2]
    left = [x for x in items if x < pivot]
    middle = [x for x in items if x == pivot]
    right = [x for x in items if x > pivot]
    return quicksort(left) + middle + quicksort(right)
''',
    '''import os
import sys
import json
from pathlib import Path
from dataclasses import dataclass, field
from typing import Optional, List, Dict


@dataclass
class Config:
    name: str
    path: Path
    values: Dict[str, int] = field(default_factory=dict)

    def load(self) -> "Config":
        with open(self.path, "r", encoding="utf-8") as f:
            data = json.load(f)
        self.values.update(data)
        return self


class Stack:
    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        if not self._items:
            raise IndexError("pop from empty stack")
        return self._items.pop()

    def __len__(self):
        return len(self._items)


if __name__ == "__main__":
    cfg = Config("main", Path(sys.argv[1])).load()
    print(cfg.values)
''',
    '''import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, hidden_size: int, inner_size: int):
        super().__init__()
        self.c_fc = nn.Linear(hidden_size, inner_size)
        self.c_proj = nn.Linear(inner_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


def train(model, loader, optimizer, epochs=10):
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for batch in loader:
            optimizer.zero_grad()
            loss = model(batch).mean()
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch}: loss {total / len(loader):.4f}")
''',
    '''function debounce(fn, wait) {
  let timer = null;
  return function (...args) {
    clearTimeout(timer);
    timer = setTimeout(() => fn.apply(this, args), wait);
  };
}

const fetchJson = async (url, options = {}) => {
  const response = await fetch(url, { ...options, headers: { "Content-Type": "application/json" } });
  if (!response.ok) {
    throw new Error(`HTTP ${response.status}: ${response.statusText}`);
  }
  return response.json();
};

export class EventEmitter {
  constructor() {
    this.listeners = new Map();
  }
  on(event, callback) {
    if (!this.listeners.has(event)) {
      this.listeners.set(event, []);
    }
    this.listeners.get(event).push(callback);
    return this;
  }
  emit(event, ...args) {
    const callbacks = this.listeners.get(event) || [];
    callbacks.forEach((cb) => cb(...args));
    return callbacks.length > 0;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const button = document.querySelector("#submit");
  button.addEventListener("click", (event) => {
    event.preventDefault();
    console.log("clicked", event.target.value);
  });
});
''',
    '''SELECT u.id, u.name, COUNT(o.id) AS order_count, SUM(o.total) AS revenue
FROM users AS u
LEFT JOIN orders AS o ON o.user_id = u.id
WHERE u.created_at >= '2024-01-01' AND u.status = 'active'
GROUP BY u.id, u.name
HAVING COUNT(o.id) > 5
ORDER BY revenue DESC
LIMIT 10;

CREATE TABLE IF NOT EXISTS products (
    id INTEGER PRIMARY KEY,
    name VARCHAR(255) NOT NULL,
    price DECIMAL(10, 2) DEFAULT 0.00,
    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
);

INSERT INTO products (name, price) VALUES ('keyboard', 49.99), ('mouse', 19.50);
UPDATE products SET price = price * 1.1 WHERE id IN (SELECT product_id FROM sales);
DELETE FROM sessions WHERE expires_at < NOW();
''',
    '''package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
)

type Server struct {
	mu    sync.Mutex
	items map[string]int
}

func NewServer() *Server {
	return &Server{items: make(map[string]int)}
}

func (s *Server) Add(key string, value int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if key == "" {
		return errors.New("empty key")
	}
	s.items[key] += value
	return nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := json.NewEncoder(w).Encode(s.items); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func main() {
	srv := NewServer()
	for i := 0; i < 10; i++ {
		_ = srv.Add(fmt.Sprintf("key-%d", i), i*i)
	}
	http.ListenAndServe(":8080", srv)
}
''',
    '''#include <stdio.h>
#include <stdlib.h>

typedef struct node {
    int value;
    struct node *next;
} node_t;

int main(int argc, char **argv) {
    node_t *head = NULL;
    for (int i = 0; i < argc; i++) {
        node_t *n = malloc(sizeof(node_t));
        n->value = atoi(argv[i]);
        n->next = head;
        head = n;
    }
    while (head != NULL) {
        printf("%d\\n", head->value);
        head = head->next;
    }
    return 0;
}
''',
    '''fn main() {
    let numbers: Vec<i32> = (1..=10).collect();
    let evens: Vec<i32> = numbers.iter().filter(|&x| x % 2 == 0).cloned().collect();
    match evens.len() {
        0 => println!("none"),
        n => println!("{} even numbers", n),
    }
}
''',
    '''#!/usr/bin/env bash
set -euo pipefail
for file in "$@"; do
  if [ -f "$file" ]; then
    echo "processing $file"
    grep -n "TODO" "$file" || true
  fi
done
''',
    '''# README

This project parses **JSON** and `YAML` files. Install with `pip install -r requirements.txt`.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 255 1024 3.14159 -1 1e-5 0x1F.
Unicode: café, naïve, Straße, 東京, Привет, 🙂.
''',
)


# Training-only documents for the default checkpoint's weights (``train_default.py``). Not part of the
# tokenizer corpus above: adding here does not change any token id.
CODE: tuple[str, ...] = (
    r'''def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def factorial(n):
    if n == 0:
        return 1
    return n * factorial(n - 1)


def is_prime(n):
    if n < 2:
        return False
    for i in range(2, int(n ** 0.5) + 1):
        if n % i == 0:
            return False
    return True


if __name__ == "__main__":
    for i in range(10):
        print(i, fibonacci(i), factorial(i), is_prime(i))
''',
    r'''def quick_sort(arr):
    if len(arr) <= 1:
        return arr
    pivot = arr[len(arr) // 2]
    left = [x for x in arr if x < pivot]
    mid = [x for x in arr if x == pivot]
    right = [x for x in arr if x > pivot]
    return quick_sort(left) + mid + quick_sort(right)


def merge_sort(arr):
    if len(arr) <= 1:
        return arr
    middle = len(arr) // 2
    left = merge_sort(arr[:middle])
    right = merge_sort(arr[middle:])
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i])
            i += 1
        else:
            result.append(right[j])
            j += 1
    result.extend(left[i:])
    result.extend(right[j:])
    return result


def binary_search(arr, target):
    lo, hi = 0, len(arr) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if arr[mid] == target:
            return mid
        if arr[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
''',
    r'''import os
import sys


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "."
    for root, dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            size = os.path.getsize(full)
            print(f"{size:10d} {full}")


if __name__ == "__main__":
    main()
''',
    r'''import os
import json
import logging

logger = logging.getLogger(__name__)


def load_config(path):
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    with open(path, "r", encoding="utf-8") as f:
        config = json.load(f)
    logger.info("loaded %d keys from %s", len(config), path)
    return config


def save_config(path, config):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
''',
    r'''import os
import re
import argparse
from collections import Counter


def count_words(text):
    words = re.findall(r"[a-z']+", text.lower())
    return Counter(words)


def main():
    parser = argparse.ArgumentParser(description="Count words in a file")
    parser.add_argument("path")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    with open(args.path) as f:
        counts = count_words(f.read())
    for word, count in counts.most_common(args.top):
        print(f"{word}: {count}")


if __name__ == "__main__":
    main()
''',
    r'''import requests


class GitHubClient:
    def __init__(self, token=None, base_url="https://api.github.com"):
        self.base_url = base_url
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"token {token}"

    def get_user(self, username):
        response = self.session.get(f"{self.base_url}/users/{username}")
        response.raise_for_status()
        return response.json()

    def list_repos(self, username):
        response = self.session.get(f"{self.base_url}/users/{username}/repos")
        response.raise_for_status()
        return [repo["name"] for repo in response.json()]
''',
    r'''from flask import Flask, jsonify, request

app = Flask(__name__)
todos = []


@app.route("/todos", methods=["GET"])
def list_todos():
    return jsonify(todos)


@app.route("/todos", methods=["POST"])
def create_todo():
    data = request.get_json()
    todo = {"id": len(todos) + 1, "title": data["title"], "done": False}
    todos.append(todo)
    return jsonify(todo), 201


@app.route("/todos/<int:todo_id>", methods=["DELETE"])
def delete_todo(todo_id):
    global todos
    todos = [t for t in todos if t["id"] != todo_id]
    return "", 204


if __name__ == "__main__":
    app.run(debug=True)
''',
    r'''import pandas as pd
import matplotlib.pyplot as plt


def load_data(path):
    df = pd.read_csv(path)
    df["date"] = pd.to_datetime(df["date"])
    df = df.dropna()
    return df


def plot_sales(df):
    monthly = df.groupby(df["date"].dt.month)["sales"].sum()
    monthly.plot(kind="bar")
    plt.xlabel("month")
    plt.ylabel("sales")
    plt.title("Monthly sales")
    plt.show()


df = load_data("sales.csv")
print(df.head())
print(df.describe())
plot_sales(df)
''',
    r'''class Node:
    def __init__(self, value):
        self.value = value
        self.next = None


class LinkedList:
    def __init__(self):
        self.head = None
        self.size = 0

    def append(self, value):
        node = Node(value)
        if self.head is None:
            self.head = node
        else:
            current = self.head
            while current.next:
                current = current.next
            current.next = node
        self.size += 1

    def __iter__(self):
        current = self.head
        while current:
            yield current.value
            current = current.next

    def __len__(self):
        return self.size
''',
    r'''import unittest


def add(a, b):
    return a + b


class TestAdd(unittest.TestCase):
    def test_add_integers(self):
        self.assertEqual(add(1, 2), 3)

    def test_add_strings(self):
        self.assertEqual(add("a", "b"), "ab")

    def test_add_lists(self):
        self.assertEqual(add([1], [2]), [1, 2])


if __name__ == "__main__":
    unittest.main()
''',
    r'''import asyncio
import aiohttp


async def fetch(session, url):
    async with session.get(url) as response:
        return await response.text()


async def main(urls):
    async with aiohttp.ClientSession() as session:
        tasks = [fetch(session, url) for url in urls]
        pages = await asyncio.gather(*tasks)
        for url, page in zip(urls, pages):
            print(url, len(page))


if __name__ == "__main__":
    asyncio.run(main(["https://example.com", "https://python.org"]))
''',
    r'''import sqlite3


def create_db(path="app.db"):
    conn = sqlite3.connect(path)
    cur = conn.cursor()
    cur.execute("CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY, name TEXT, email TEXT)")
    conn.commit()
    return conn


def add_user(conn, name, email):
    cur = conn.cursor()
    cur.execute("INSERT INTO users (name, email) VALUES (?, ?)", (name, email))
    conn.commit()
    return cur.lastrowid


def get_users(conn):
    cur = conn.cursor()
    cur.execute("SELECT id, name, email FROM users ORDER BY name")
    return cur.fetchall()
''',
    r'''def read_lines(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def write_lines(path, lines):
    with open(path, "w") as f:
        for line in lines:
            f.write(line + "\n")


def chunks(items, size):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def flatten(nested):
    return [x for sub in nested for x in sub]


def unique(items):
    seen = set()
    result = []
    for item in items:
        if item not in seen:
            seen.add(item)
            result.append(item)
    return result
''',
    r'''import time
import functools


def timer(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        result = func(*args, **kwargs)
        elapsed = time.perf_counter() - start
        print(f"{func.__name__} took {elapsed:.3f}s")
        return result
    return wrapper


def retry(times=3, delay=1.0):
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            for attempt in range(times):
                try:
                    return func(*args, **kwargs)
                except Exception:
                    if attempt == times - 1:
                        raise
                    time.sleep(delay)
        return wrapper
    return decorator
''',
    r'''import torch
from torch.utils.data import Dataset, DataLoader


class TextDataset(Dataset):
    def __init__(self, texts, tokenizer, max_length=128):
        self.texts = texts
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, idx):
        ids = self.tokenizer.encode(self.texts[idx])[: self.max_length]
        return torch.tensor(ids, dtype=torch.long)


def evaluate(model, loader, device="cpu"):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            pred = model(x).argmax(dim=-1)
            correct += (pred == y).sum().item()
            total += y.numel()
    return correct / total
''',
    r'''class BankAccount:
    def __init__(self, owner, balance=0.0):
        self.owner = owner
        self.balance = balance

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        return self.balance

    def withdraw(self, amount):
        if amount > self.balance:
            raise ValueError("insufficient funds")
        self.balance -= amount
        return self.balance

    def __repr__(self):
        return f"BankAccount({self.owner!r}, {self.balance:.2f})"
''',
    r'''def gcd(a, b):
    while b:
        a, b = b, a % b
    return a


def lcm(a, b):
    return a * b // gcd(a, b)


def is_palindrome(s):
    s = "".join(c.lower() for c in s if c.isalnum())
    return s == s[::-1]


def reverse_words(sentence):
    return " ".join(reversed(sentence.split()))


def main():
    print(gcd(12, 18), lcm(4, 6))
    print(is_palindrome("A man, a plan, a canal: Panama"))
    print(reverse_words("hello world"))
''',
    r'''import os
import subprocess
from pathlib import Path


def run(cmd, cwd=None):
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True)
    return result.stdout.strip()


def git_branch(repo):
    return run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=repo)


def find_files(root, suffix=".py"):
    return sorted(str(p) for p in Path(root).rglob(f"*{suffix}"))


if __name__ == "__main__":
    repo = os.getcwd()
    print(git_branch(repo))
    for path in find_files(repo):
        print(path)
''',
    r'''const express = require("express");
const app = express();
const PORT = process.env.PORT || 3000;

app.use(express.json());

const users = [];

app.get("/users", (req, res) => {
  res.json(users);
});

app.post("/users", (req, res) => {
  const { name, email } = req.body;
  if (!name || !email) {
    return res.status(400).json({ error: "name and email are required" });
  }
  const user = { id: users.length + 1, name, email };
  users.push(user);
  res.status(201).json(user);
});

app.listen(PORT, () => {
  console.log(`Server listening on port ${PORT}`);
});
''',
    r'''function fibonacci(n) {
  if (n < 2) {
    return n;
  }
  return fibonacci(n - 1) + fibonacci(n - 2);
}

function sum(numbers) {
  return numbers.reduce((total, n) => total + n, 0);
}

const unique = (items) => [...new Set(items)];

const groupBy = (items, key) =>
  items.reduce((groups, item) => {
    (groups[item[key]] = groups[item[key]] || []).push(item);
    return groups;
  }, {});

module.exports = { fibonacci, sum, unique, groupBy };
''',
    r'''import React, { useState, useEffect } from "react";

export default function TodoList() {
  const [todos, setTodos] = useState([]);
  const [text, setText] = useState("");

  useEffect(() => {
    fetch("/api/todos")
      .then((res) => res.json())
      .then((data) => setTodos(data));
  }, []);

  const addTodo = () => {
    setTodos([...todos, { id: Date.now(), text, done: false }]);
    setText("");
  };

  return (
    <div>
      <input value={text} onChange={(e) => setText(e.target.value)} />
      <button onClick={addTodo}>Add</button>
      <ul>
        {todos.map((todo) => (
          <li key={todo.id}>{todo.text}</li>
        ))}
      </ul>
    </div>
  );
}
''',
    r'''interface User {
  id: number;
  name: string;
  email?: string;
}

export async function getUser(id: number): Promise<User> {
  const response = await fetch(`/api/users/${id}`);
  if (!response.ok) {
    throw new Error(`failed to load user ${id}`);
  }
  return (await response.json()) as User;
}

export function formatUser(user: User): string {
  return user.email ? `${user.name} <${user.email}>` : user.name;
}
''',
    r'''SELECT id, name, email
FROM customers
WHERE country = 'DE'
ORDER BY name;

SELECT c.name, COUNT(o.id) AS orders
FROM customers c
JOIN orders o ON o.customer_id = c.id
GROUP BY c.name
ORDER BY orders DESC
LIMIT 5;

SELECT product_id, AVG(rating) AS avg_rating
FROM reviews
GROUP BY product_id
HAVING AVG(rating) >= 4.0;
''',
    r'''SELECT * FROM employees WHERE salary > 50000;

SELECT department, MAX(salary) AS top_salary, MIN(salary) AS low_salary
FROM employees
GROUP BY department;

SELECT e.name, d.name AS department
FROM employees e
INNER JOIN departments d ON e.department_id = d.id
WHERE d.location = 'Berlin';

UPDATE employees SET salary = salary * 1.05 WHERE department = 'engineering';
''',
    r'''CREATE TABLE users (
    id SERIAL PRIMARY KEY,
    username VARCHAR(50) UNIQUE NOT NULL,
    email VARCHAR(255) NOT NULL,
    created_at TIMESTAMP NOT NULL DEFAULT NOW()
);

CREATE INDEX idx_users_email ON users (email);

CREATE TABLE orders (
    id SERIAL PRIMARY KEY,
    user_id INTEGER REFERENCES users (id) ON DELETE CASCADE,
    total NUMERIC(10, 2) NOT NULL,
    status VARCHAR(20) DEFAULT 'pending'
);

SELECT status, COUNT(*) FROM orders GROUP BY status;
''',
    r'''WITH recent AS (
    SELECT user_id, SUM(total) AS spent
    FROM orders
    WHERE created_at > NOW() - INTERVAL '30 days'
    GROUP BY user_id
)
SELECT u.username, r.spent
FROM users u
JOIN recent r ON r.user_id = u.id
ORDER BY r.spent DESC
LIMIT 20;
''',
    r'''package main

import (
	"fmt"
	"os"
	"strings"
)

func reverse(s string) string {
	runes := []rune(s)
	for i, j := 0, len(runes)-1; i < j; i, j = i+1, j-1 {
		runes[i], runes[j] = runes[j], runes[i]
	}
	return string(runes)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Println("usage: reverse WORD")
		os.Exit(1)
	}
	word := strings.TrimSpace(os.Args[1])
	fmt.Println(reverse(word))
}
''',
    r'''package main

import (
	"bufio"
	"fmt"
	"log"
	"os"
)

func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	n := 0
	for scanner.Scan() {
		n++
	}
	return n, scanner.Err()
}

func main() {
	for _, path := range os.Args[1:] {
		n, err := countLines(path)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d %s\n", n, path)
	}
}
''',
    r'''package main

import (
	"fmt"
	"sync"
)

func worker(id int, jobs <-chan int, results chan<- int, wg *sync.WaitGroup) {
	defer wg.Done()
	for j := range jobs {
		fmt.Printf("worker %d processing job %d\n", id, j)
		results <- j * 2
	}
}

func main() {
	jobs := make(chan int, 100)
	results := make(chan int, 100)
	var wg sync.WaitGroup
	for w := 1; w <= 3; w++ {
		wg.Add(1)
		go worker(w, jobs, results, &wg)
	}
	for j := 1; j <= 9; j++ {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	close(results)
}
''',
    r'''#!/bin/bash
set -e

BACKUP_DIR="/var/backups"
DATE=$(date +%Y-%m-%d)

mkdir -p "$BACKUP_DIR"
for db in users orders products; do
  echo "backing up $db"
  pg_dump "$db" | gzip > "$BACKUP_DIR/$db-$DATE.sql.gz"
done

find "$BACKUP_DIR" -name "*.sql.gz" -mtime +7 -delete
echo "done"
''',
    r'''#!/usr/bin/env bash
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 NAME" >&2
  exit 1
fi

NAME="$1"
python3 -m venv .venv
source .venv/bin/activate
pip install -r requirements.txt
echo "created environment for $NAME"
''',
    r'''FROM python:3.11-slim
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
EXPOSE 8000
CMD ["uvicorn", "main:app", "--host", "0.0.0.0", "--port", "8000"]
''',
    r'''from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

app = FastAPI()


class Item(BaseModel):
    name: str
    price: float
    quantity: int = 1


items: dict[int, Item] = {}


@app.get("/items/{item_id}")
def read_item(item_id: int):
    if item_id not in items:
        raise HTTPException(status_code=404, detail="item not found")
    return items[item_id]


@app.post("/items/{item_id}")
def create_item(item_id: int, item: Item):
    items[item_id] = item
    return {"id": item_id, "total": item.price * item.quantity}
''',
    r'''def bubble_sort(arr):
    n = len(arr)
    for i in range(n):
        for j in range(0, n - i - 1):
            if arr[j] > arr[j + 1]:
                arr[j], arr[j + 1] = arr[j + 1], arr[j]
    return arr


def insertion_sort(arr):
    for i in range(1, len(arr)):
        key = arr[i]
        j = i - 1
        while j >= 0 and arr[j] > key:
            arr[j + 1] = arr[j]
            j -= 1
        arr[j + 1] = key
    return arr


print(bubble_sort([5, 2, 9, 1]))
print(insertion_sort([3, 8, 1, 4]))
''',
    r'''from collections import deque


def bfs(graph, start):
    visited = {start}
    queue = deque([start])
    order = []
    while queue:
        node = queue.popleft()
        order.append(node)
        for neighbor in graph[node]:
            if neighbor not in visited:
                visited.add(neighbor)
                queue.append(neighbor)
    return order


def dfs(graph, node, visited=None):
    if visited is None:
        visited = set()
    visited.add(node)
    for neighbor in graph[node]:
        if neighbor not in visited:
            dfs(graph, neighbor, visited)
    return visited
''',
)


def _fim(doc: str, a: int, b: int) -> str:
    """A StarCoder FIM (prefix-suffix-middle) example whose middle is ``doc``'s lines [a, b) without line a's
    indentation and line b-1's newline (the cut a FIM prompt makes inside an indented block)."""
    lines = doc.splitlines(keepends=True)
    indent = lines[a][: len(lines[a]) - len(lines[a].lstrip(" \t"))]
    pre = "".join(lines[:a]) + indent
    mid = "".join(lines[a:b])[len(indent):-1]
    suf = "\n" + "".join(lines[b:])
    return f"<fim_prefix>{pre}<fim_suffix>{suf}<fim_middle>{mid}"


def training_documents() -> tuple[str, ...]:
    """The default checkpoint's training set: every code document of CORPUS and CODE, plus two FIM examples
    cut from each at fixed line spans (lines 3-6 and two lines in the middle); each ends with
    ``<|endoftext|>``. Deterministic."""
    docs = [d for d in CORPUS if not d.startswith("# README")] + list(CODE)
    fims = []
    for d in docs:
        lines = d.splitlines()
        n = len(lines)
        for a, b in ((3, 7), (n // 2, n // 2 + 2)):
            if b < n and lines[a].strip() and lines[b - 1].strip():
                fims.append(_fim(d, a, b))
    return tuple(x + "<|endoftext|>" for x in docs + fims)
